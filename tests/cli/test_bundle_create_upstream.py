"""One command from upstream's folders to a bundle that runs: `farm bundle create` on folders named and
shaped as ExecuTorch v1.0.1 leaves them (llama.py's artifact folder, the Android build folder,
$QNN_SDK_ROOT), the runner being the README's two-line wrapper around farm-llama-runner; deployed and
run on a virtual SM8650, it writes what the reference bundle writes for the same request. """

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from farm.bundle import manifest as bundle_mod
from farm.cli.main import main as farm_main
from farm.device.discovery import find_device
from farm.execute.deploy import deploy
from farm.execute.run import run, runner_dialect
from farm.execute.runprofile import RunRequest
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.vocab import Dialect

WRAPPER = '#!/system/bin/sh\nexec farm-llama-runner "$@"\n'  # README, "Virtual devices"
# The backend library of the build the virtual device's runner is: executorch's own (x86_64) copy.
HOST_BACKEND = Path(__import__("executorch").__path__[0]) / "backends" / "qualcomm" / \
    "libqnn_executorch_backend.so"


def _upstream_folders(reference: bundle_mod.Bundle, root: Path) -> dict[str, Path]:
    artifact, build, sdk = root / "llama_qnn", root / "build-android", root / "qnn-sdk"
    llama = build / "examples" / "qualcomm" / "oss_scripts" / "llama"
    for folder in (artifact, llama, build / "backends" / "qualcomm", sdk / "lib" / "aarch64-android",
                   sdk / "lib" / "hexagon-v75" / "unsigned"):
        folder.mkdir(parents=True)
    path = {f.name: f.path for f in reference.files}
    programs = {m.eval_mode: path[m.pte] for m in reference.modes.values()}
    shutil.copyfile(programs[0], artifact / "kv_llama_qnn.pte")  # llama.py's pte_filename per mode
    shutil.copyfile(programs[1], artifact / "hybrid_llama_qnn.pte")
    shutil.copyfile(path[reference.tokenizer], artifact / "tokenizer.model")
    (llama / "qnn_llama_runner").write_text(WRAPPER)
    shutil.copyfile(HOST_BACKEND, build / "backends" / "qualcomm" / "libqnn_executorch_backend.so")
    for lib in ("libQnnHtp.so", "libQnnHtpPrepare.so", "libQnnSystem.so", "libQnnHtpV75Stub.so"):
        (sdk / "lib" / "aarch64-android" / lib).write_text(lib)
    (sdk / "lib" / "hexagon-v75" / "unsigned" / "libQnnHtpV75Skel.so").write_text("skel")
    return {"artifact": artifact, "build": build, "sdk": sdk}


@pytest.fixture(scope="module")
def phone(tmp_path_factory):
    with VirtualFarm(home=tmp_path_factory.mktemp("farm")) as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        yield find_device([vf.adb_server], record.serial)


def _create(folders: dict[str, Path], manifest: Path, reference: bundle_mod.Bundle):
    return CliRunner().invoke(farm_main, [
        "bundle", "create", str(manifest), "--name", manifest.parent.name,
        "--artifact", str(folders["artifact"]), "--build-folder", str(folders["build"]),
        "--htp-arch", "v75", "--hybrid-ar-len", str(reference.modes["hybrid"].ar_len),
        "--decoder-model-version", reference.decoder_model_version],
        env={"QNN_SDK_ROOT": str(folders["sdk"])})


REQUEST = RunRequest(prompts=["Once upon a time"], mode="hybrid", seq_len=48)


def test_upstream_folders_make_a_bundle_whose_wrapper_runner_runs(phone, tiny_bundle, tmp_path):
    reference = bundle_mod.load(tiny_bundle)
    folders = _upstream_folders(reference, tmp_path / "upstream")
    manifest = tmp_path / "bundles" / "wrapped" / "manifest.json"
    created = _create(folders, manifest, reference)
    assert created.exit_code == 0, created.output
    bundle = bundle_mod.load(manifest, verify=True)
    assert bundle.runner_dialect == "auto"  # the default: the wrapper tells what it is
    deploy(phone, bundle)
    # Its --help is farm-llama-runner's (seconds on a loaded host: given minutes here).
    assert runner_dialect(phone, bundle, timeout=300) is Dialect.HOST
    wrapped = run(phone, bundle, REQUEST, timeout=300, io_timeout=300)
    deploy(phone, reference)
    direct = run(phone, reference, REQUEST, timeout=300, io_timeout=300)
    assert wrapped.text_bytes and wrapped.text_bytes == direct.text_bytes
    assert wrapped.generated_ids == direct.generated_ids
