"""One command from upstream's folders to a bundle that runs: `farm bundle create` on folders named and
shaped as ExecuTorch v1.0.1 leaves them (llama.py's artifact folder, the Android build folder,
$QNN_SDK_ROOT; farm.selftest.upstream stages them from the reference export), the runner being the
README's two-line wrapper around farm-llama-runner; deployed and run on a virtual SM8650, it writes what
the reference bundle writes for the same request. So does the stand-in of a v1.0.1 qnn_llama_runner
(ci/qualify.sh's upstream run), driven as one: dialect qnn-v1.0, upstream's flags only."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from farm.bundle import manifest as bundle_mod
from farm.cli.main import main as farm_main
from farm.device.discovery import find_device
from farm.execute.deploy import deploy
from farm.execute.run import run, runner_dialect, takes_flag
from farm.execute.runprofile import RunRequest
from farm.selftest.upstream import V1_0_1_RUNNER, UpstreamFolders, stage_upstream
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.vocab import Dialect


@pytest.fixture(scope="module")
def phone(tmp_path_factory):
    with VirtualFarm(home=tmp_path_factory.mktemp("farm")) as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        yield find_device([vf.adb_server], record.serial)


def _create(folders: UpstreamFolders, manifest: Path):
    return CliRunner().invoke(farm_main, [
        "bundle", "create", str(manifest), "--name", manifest.parent.name,
        "--artifact", str(folders.artifact), "--build-folder", str(folders.build),
        "--htp-arch", "v75", "--hybrid-ar-len", str(folders.hybrid_ar_len),
        "--decoder-model-version", folders.decoder_model_version],
        env={"QNN_SDK_ROOT": str(folders.sdk)})


REQUEST = RunRequest(prompts=["Once upon a time"], mode="hybrid", seq_len=48)


def test_upstream_folders_make_a_bundle_whose_wrapper_runner_runs(phone, tiny_bundle, tmp_path):
    reference = bundle_mod.load(tiny_bundle)
    folders = stage_upstream(reference, tmp_path / "upstream", htp_archs=("v75",))  # the README's wrapper
    manifest = tmp_path / "bundles" / "wrapped" / "manifest.json"
    created = _create(folders, manifest)
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


def test_a_v1_0_1_runner_is_driven_with_upstreams_flags_and_writes_the_same(phone, tiny_bundle, tmp_path):
    reference = bundle_mod.load(tiny_bundle)
    folders = stage_upstream(reference, tmp_path / "upstream", runner=V1_0_1_RUNNER, htp_archs=("v75",))
    manifest = tmp_path / "bundles" / "v1-0-1" / "manifest.json"
    created = _create(folders, manifest)
    assert created.exit_code == 0, created.output
    bundle = bundle_mod.load(manifest, verify=True)
    deploy(phone, bundle)
    assert runner_dialect(phone, bundle, timeout=300) is Dialect.QNN_V1_0  # its --help is v1.0.1's
    assert not takes_flag(phone, bundle, "token_ids_path") and takes_flag(phone, bundle, "kv_updater")
    assert not takes_flag(phone, bundle, "dump_logits_path")  # float32 where a phone dumps uint16
    upstream = run(phone, bundle, REQUEST, timeout=300, io_timeout=300)
    assert "--kv_updater" in upstream.command and "--token_ids_path" not in upstream.command
    assert upstream.generated_ids is None  # what it says is outputs.txt, inference_speed.txt, stdout
    deploy(phone, reference)
    direct = run(phone, reference, REQUEST, timeout=300, io_timeout=300)
    assert upstream.text_bytes and upstream.text_bytes == direct.text_bytes
    assert upstream.tokens_per_s and upstream.observer and direct.observer
    counts = ("prompt_tokens", "generated_tokens")
    assert [upstream.observer[k] for k in counts] == [direct.observer[k] for k in counts]
