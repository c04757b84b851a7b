"""`farm bundle create` for real QNN artifacts: the SimpleADB file set, Stub/Skel per HTP arch."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from farm.bundle import manifest as bundle_mod
from farm.cli.main import main as farm_main


def _file(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture()
def artifacts(tmp_path) -> dict[str, Path]:
    sdk = tmp_path / "qnn-sdk"
    for lib in ("libQnnHtp.so", "libQnnHtpPrepare.so", "libQnnSystem.so", "libQnnHtpV73Stub.so",
                "libQnnHtpV75Stub.so"):
        _file(sdk / "lib" / "aarch64-android" / lib, lib)
    for n in ("73", "75"):
        _file(sdk / "lib" / f"hexagon-v{n}" / "unsigned" / f"libQnnHtpV{n}Skel.so", f"skel {n}")
    build = tmp_path / "build-android"
    return {"sdk": sdk,
            "runner": _file(build / "qnn_llama_runner", "runner"),
            "backend": _file(build / "libqnn_executorch_backend.so", "backend"),
            "kv": _file(tmp_path / "out" / "kv_llama_qnn.pte", "kv program"),
            "hybrid": _file(tmp_path / "out" / "hybrid_llama_qnn.pte", "hybrid program"),
            "tok": _file(tmp_path / "out" / "tokenizer.model", "tok")}


def _create(a, manifest, *extra):
    return CliRunner().invoke(farm_main, [
        "bundle", "create", str(manifest), "--name", "llama3_2-1b", "--pte", f"kv={a['kv']}",
        "--pte", f"hybrid={a['hybrid']}", "--tokenizer", str(a["tok"]), "--runner", str(a["runner"]),
        "--backend-lib", str(a["backend"]), "--qnn-sdk", str(a["sdk"]), *extra])


def test_manifest_for_two_htp_archs(artifacts, tmp_path):
    manifest = tmp_path / "bundles" / "manifest.json"
    result = _create(artifacts, manifest, "--htp-arch", "v73", "--htp-arch", "v75")
    assert result.exit_code == 0, result.output
    b = bundle_mod.load(manifest, verify=True)
    assert b.runner_dialect == "qnn-v1.0" and b.runner == "qnn_llama_runner"
    assert b.modes["hybrid"].eval_mode == 1 and b.modes["hybrid"].ar_len == 32
    v75 = {f.name for f in b.files_for("v75")}
    assert {"libQnnHtpV75Stub.so", "libQnnHtpV75Skel.so", "libQnnHtp.so", "libQnnSystem.so",
            "libQnnHtpPrepare.so", "qnn_llama_runner", "libqnn_executorch_backend.so",
            "kv_llama_qnn.pte", "hybrid_llama_qnn.pte", "tokenizer.model"} == v75
    assert "libQnnHtpV73Skel.so" in {f.name for f in b.files_for("v73")}
    # A file changed after the manifest was written is caught by verify.
    artifacts["kv"].write_text("kv progran")
    result = CliRunner().invoke(farm_main, ["bundle", "verify", str(manifest)])
    assert result.exit_code == 2 and "sha256" in result.output


@pytest.mark.parametrize("extra,needle", [
    (["--htp-arch", "v79"], "libQnnHtpV79Stub.so"),
    (["--htp-arch", "seventy"], "--htp-arch"),
    (["--htp-arch", "v75", "--dialect", "host"], "--dialect"),
    (["--htp-arch", "v75", "--pte", "turbo=x.pte"], "turbo"),
    (["--htp-arch", "v75", "--pte", "kvonly"], "MODE=FILE"),
])
def test_bad_input_names_the_flag(artifacts, tmp_path, extra, needle):
    manifest = tmp_path / "manifest.json"
    result = _create(artifacts, manifest, *extra)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert not manifest.exists()
