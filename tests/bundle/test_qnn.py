"""`farm bundle create` for real QNN artifacts: the SimpleADB file set, Stub/Skel per HTP arch, found
by upstream's names in the folders ExecuTorch v1.0.1's build and llama.py leave.

The fake trees below are shaped as upstream leaves them (v1.0.1):
- examples/qualcomm/utils.py, SimpleADB.push (lines 131-147): the .pte files,
  ``{qnn_sdk}/lib/aarch64-android/`` libQnnHtp.so, libQnnHtpV{arch}Stub.so, libQnnHtpPrepare.so,
  libQnnSystem.so, libQnnModelDlc.so, ``{qnn_sdk}/lib/hexagon-v{arch}/unsigned/libQnnHtpV{arch}Skel.so``,
  ``{build_path}/{runner}`` and ``{build_path}/backends/qualcomm/libqnn_executorch_backend.so``;
- examples/qualcomm/oss_scripts/llama/llama.py: ``runner=f"examples/qualcomm/oss_scripts/llama/
  qnn_llama_runner"`` (line 1008), ``pte_filename`` kv_llama_qnn / hybrid_llama_qnn / lookahead_llama_qnn,
  ``stories260k_`` in front for that model (lines 1238-1256), the HF tokenizer saved into ``--artifact``
  by ``save_pretrained``, its last file tokenizer.json the runtime one (lines 1285-1287), outputs pulled
  into ``{artifact}/outputs`` (line 922).
"""

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
    # The default dialect is the runner's own (its --help on the device): a wrapper script around
    # farm-llama-runner and a real v1.0.1 or v1.1 runner are all taken for what they are.
    assert b.runner_dialect == "auto" and b.runner == "qnn_llama_runner"
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


# -- upstream's folders, found by upstream's names -------------------------------------------------------

ELF_AARCH64 = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x03\x00\xb7\x00"  # ET_DYN, EM_AARCH64 (183)
ELF_X86_64 = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x03\x00\x3e\x00"  # EM_X86_64 (62)
SIMPLEADB_PUSHES_V75 = {"libQnnHtp.so", "libQnnHtpV75Skel.so", "libQnnHtpV75Stub.so",
                        "libQnnHtpPrepare.so", "libQnnSystem.so", "qnn_llama_runner",
                        "libqnn_executorch_backend.so", "libQnnModelDlc.so"}


def _binary(path: Path, label: str, head: bytes = ELF_AARCH64) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + label.encode())
    return path


@pytest.fixture()
def upstream(tmp_path) -> dict[str, Path]:
    """$QNN_SDK_ROOT, build-android and llama.py's artifact folder after a qwen2_5 hybrid build and
    one inference run, as v1.0.1 leaves them."""
    sdk = tmp_path / "qairt" / "2.37.0.250724"
    android = sdk / "lib" / "aarch64-android"
    for lib in ("libQnnHtp.so", "libQnnHtpPrepare.so", "libQnnSystem.so", "libQnnModelDlc.so",
                "libQnnHtpV73Stub.so", "libQnnHtpV75Stub.so", "libQnnHtpV79Stub.so"):
        _binary(android / lib, f"android {lib}")
    for n in ("73", "75", "79"):
        _binary(sdk / "lib" / f"hexagon-v{n}" / "unsigned" / f"libQnnHtpV{n}Skel.so", f"skel v{n}",
                head=b"\x7fELF\x01\x01\x01" + b"\0" * 9 + b"\x03\x00\xa4\x00")  # QDSP6
    # The same names for the host: never the ones a phone gets.
    for lib in ("libQnnHtp.so", "libQnnSystem.so"):
        _binary(sdk / "lib" / "x86_64-linux-clang" / lib, f"x86 {lib}", ELF_X86_64)
    build = tmp_path / "executorch" / "build-android"
    _binary(build / "examples" / "qualcomm" / "oss_scripts" / "llama" / "qnn_llama_runner", "runner")
    _binary(build / "backends" / "qualcomm" / "libqnn_executorch_backend.so", "backend")
    _binary(build / "lib" / "libexecutorch.a", "static lib")  # the rest of the build, unused
    artifact = tmp_path / "executorch" / "llama_qnn"
    _file(artifact / "hybrid_llama_qnn.pte", "hybrid program")
    _file(artifact / "kv_llama_qnn.pte", "kv program")
    for name in ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"):
        _file(artifact / name, "{}")  # save_pretrained's files; the runner loads tokenizer.json
    _file(artifact / "outputs" / "outputs.txt", "left by an inference run")
    _file(artifact / "outputs" / "inference_speed.txt", "12.5")
    return {"sdk": sdk, "build": build, "artifact": artifact}


def _create_env(manifest: Path, *args: str, sdk: Path | None = None):
    env = {"QNN_SDK_ROOT": str(sdk)} if sdk is not None else {"QNN_SDK_ROOT": None}
    return CliRunner().invoke(farm_main, ["bundle", "create", str(manifest), "--name", "qwen2_5-0_5b",
                                          *args], env=env)


def test_one_command_from_upstreams_artifact_and_build_folders(upstream, tmp_path):
    manifest = tmp_path / "bundles" / "qwen" / "manifest.json"
    result = _create_env(manifest, "--artifact", str(upstream["artifact"]), "--build-folder",
                         str(upstream["build"]), "--htp-arch", "v75", "--decoder-model-version",
                         "qwen2_5", sdk=upstream["sdk"])  # the SDK from $QNN_SDK_ROOT
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output
    b = bundle_mod.load(manifest, verify=True)
    assert b.runner_dialect == "auto" and b.decoder_model_version == "qwen2_5"
    assert {m: (b.modes[m].pte, b.modes[m].eval_mode) for m in b.modes} == {
        "kv": ("kv_llama_qnn.pte", 0), "hybrid": ("hybrid_llama_qnn.pte", 1)}
    assert b.tokenizer == "tokenizer.json" and b.runner == "qnn_llama_runner"
    # Exactly what SimpleADB pushes for an SM8650 (v75), plus llama.py's pte files and tokenizer.
    assert {f.name for f in b.files_for("v75")} == SIMPLEADB_PUSHES_V75 | {
        "kv_llama_qnn.pte", "hybrid_llama_qnn.pte", "tokenizer.json"}
    by_name = {f.name: f for f in b.files_for("v75")}
    assert by_name["libQnnHtp.so"].path.read_bytes().endswith(b"android libQnnHtp.so")
    assert by_name["libQnnHtpV75Skel.so"].htp_arch == "v75"
    assert by_name["qnn_llama_runner"].role == "runner"
    assert by_name["libqnn_executorch_backend.so"].role == "backend_lib"


def test_flat_folders_as_a_build_script_or_a_device_workspace_holds_them(upstream, tmp_path):
    """One flat folder of every file SimpleADB pushes (a workspace pulled off a phone, a CI cache)
    serves as artifact folder, build folder and QNN library folder at once."""
    flat = tmp_path / "flat"
    for path in upstream["sdk"].glob("lib/aarch64-android/*.so"):
        _binary(flat / path.name, path.read_bytes().decode("latin-1")[20:])
    _binary(flat / "libQnnHtpV75Skel.so", "skel v75")
    _binary(flat / "qnn_llama_runner", "runner")
    _binary(flat / "libqnn_executorch_backend.so", "backend")
    _file(flat / "stories260k_hybrid_llama_qnn.pte", "hybrid program")
    _file(flat / "tokenizer.bin", "llama2c")
    manifest = tmp_path / "bundles" / "flat" / "manifest.json"
    result = _create_env(manifest, "--artifact", str(flat), "--build-folder", str(flat),
                         "--qnn-sdk", str(flat), "--htp-arch", "v75", "--decoder-model-version",
                         "llama2")
    assert result.exit_code == 0, result.output
    b = bundle_mod.load(manifest, verify=True)
    assert {f.name for f in b.files_for("v75")} == SIMPLEADB_PUSHES_V75 | {
        "stories260k_hybrid_llama_qnn.pte", "tokenizer.bin"}
    assert b.modes["hybrid"].pte == "stories260k_hybrid_llama_qnn.pte" and list(b.modes) == ["hybrid"]
    assert b.tokenizer == "tokenizer.bin"


def test_flags_name_files_the_folders_do_not_hold(upstream, tmp_path):
    # llama3_2 keeps its tiktoken tokenizer.model outside the artifact folder (llama.py line 1275);
    # a --pte chooses among programs.
    tok = _file(tmp_path / "Llama-3.2-1B" / "original" / "tokenizer.model", "tiktoken")
    for name in ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"):
        (upstream["artifact"] / name).unlink()
    manifest = tmp_path / "bundles" / "l" / "manifest.json"
    result = _create_env(manifest, "--artifact", str(upstream["artifact"]), "--tokenizer", str(tok),
                         "--pte", f"kv={upstream['artifact'] / 'kv_llama_qnn.pte'}",
                         "--build-folder", str(upstream["build"]), "--htp-arch", "v79",
                         sdk=upstream["sdk"])
    assert result.exit_code == 0, result.output
    b = bundle_mod.load(manifest, verify=True)
    assert b.tokenizer == "tokenizer.model" and list(b.modes) == ["kv"]


@pytest.mark.parametrize("change,args,needle", [
    (lambda u: [p.unlink() for p in u["artifact"].glob("*.pte")], (),
     "holds none of kv_llama_qnn.pte, hybrid_llama_qnn.pte, lookahead_llama_qnn.pte"),
    (lambda u: (u["artifact"] / "tokenizer.json").unlink(), (), "holds none of tokenizer.json"),
    (lambda u: _file(u["artifact"] / "tokenizer.bin", "x"), (),
     "several tokenizers (tokenizer.json, tokenizer.bin)"),
    (lambda u: _file(u["artifact"] / "stories260k_kv_llama_qnn.pte", "x"), (),
     "2 kv programs (kv_llama_qnn.pte, stories260k_kv_llama_qnn.pte)"),
    (lambda u: (u["build"] / "examples" / "qualcomm" / "oss_scripts" / "llama" / "qnn_llama_runner")
     .unlink(), (), "has no examples/qualcomm/oss_scripts/llama/qnn_llama_runner"),
    (lambda u: (u["build"] / "backends" / "qualcomm" / "libqnn_executorch_backend.so").unlink(), (),
     "has no backends/qualcomm/libqnn_executorch_backend.so"),
    (lambda u: None, ("--qnn-sdk", "{build}"), "neither a QNN SDK root"),
    (lambda u: (u["sdk"] / "lib" / "hexagon-v75" / "unsigned" / "libQnnHtpV75Skel.so").unlink(), (),
     "libQnnHtpV75Skel.so does not exist"),
])
def test_what_the_folders_lack_is_named(upstream, tmp_path, change, args, needle):
    change(upstream)
    manifest = tmp_path / "bundles" / "bad" / "manifest.json"
    args = [a.format(build=upstream["build"]) for a in args]
    result = _create_env(manifest, "--artifact", str(upstream["artifact"]), "--build-folder",
                         str(upstream["build"]), "--htp-arch", "v75", *args, sdk=upstream["sdk"])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert not manifest.exists() and not list(manifest.parent.rglob("*.*"))  # nothing left behind


def test_without_qnn_sdk_root_the_sdk_must_be_named(upstream, tmp_path):
    manifest = tmp_path / "manifest.json"
    result = _create_env(manifest, "--artifact", str(upstream["artifact"]), "--build-folder",
                         str(upstream["build"]), "--htp-arch", "v75")
    assert result.exit_code == 2 and "--qnn-sdk" in result.output and "QNN_SDK_ROOT" in result.output


def test_a_runner_no_phone_can_load_is_warned_about(upstream, tmp_path):
    """A Git LFS pointer for the backend library, the x86_64 build's runner: written down (virtual
    devices run stand-ins), each named in a warning."""
    (upstream["build"] / "backends" / "qualcomm" / "libqnn_executorch_backend.so").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n")
    _binary(upstream["build"] / "examples" / "qualcomm" / "oss_scripts" / "llama" / "qnn_llama_runner",
            "x86 runner", ELF_X86_64)
    manifest = tmp_path / "m" / "manifest.json"
    result = _create_env(manifest, "--artifact", str(upstream["artifact"]), "--build-folder",
                         str(upstream["build"]), "--htp-arch", "v75", sdk=upstream["sdk"])
    assert result.exit_code == 0, result.output
    assert "libqnn_executorch_backend.so" in result.stderr and "not an ELF file" in result.stderr
    assert "qnn_llama_runner" in result.stderr and "machine 62, not aarch64" in result.stderr
