"""Deploy planning and run parsing on a FakeDevice (tests/support/fake_device.py): no adb server.

What a deploy pushes, skips and hashes on the device; and what a run makes of the runner's files,
exit code and output, with the fake qnn_llama_runner of tests/support/devices.py.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.device.protocol import DeviceLike
from farm.errors import AdbError, DeviceTimeout, RunIncomplete, UsageError
from farm.execute.deploy import PARTIAL_SUFFIX, RECORD_NAME, bundle_workspace, deploy
from farm.execute.run import RunnerFailed, run
from farm.execute.runprofile import RunRequest
from tests.support.devices import make_qnn_bundle
from tests.support.fake_device import FakeDevice

FULL_DISK_DF = """#!/bin/sh
echo "Filesystem     1K-blocks    Used Available Use% Mounted on"
echo "/dev/block/dm-48 100 99 1 99% /data"
"""


@pytest.fixture
def bundle(tmp_path):
    return bundle_mod.load(make_qnn_bundle(tmp_path / "bundle", name="plan"))


@pytest.fixture
def device(tmp_path):
    return FakeDevice(tmp_path / "device", soc="SM8650")


def _ws(device: FakeDevice, bundle) -> Path:
    return Path(bundle_workspace(device, bundle))


def _pushed_names(device: FakeDevice) -> list[str]:
    return sorted(posixpath.basename(p).removesuffix(PARTIAL_SUFFIX) for p in device.pushes
                  if RECORD_NAME not in p)


def test_fake_device_is_device_like_and_confined(device):
    assert isinstance(device, DeviceLike)
    for command in ("cat /etc/hostname", "cd .. && ls", f"cp x {device.root.parent}/y"):
        with pytest.raises(AssertionError, match="outside|'\\.\\.'"):
            device.shell(command, timeout=5)
    with pytest.raises(AssertionError, match="outside"):
        device.push(io.BytesIO(b"x"), "/tmp/escaped", timeout=5)
    assert device.commands == [] and device.pushes == []
    assert device.shell("echo hi; echo err >&2; exit 3", timeout=5).exit_code == 3
    with pytest.raises(AdbError, match="exited 3"):
        device.shell("exit 3", timeout=5, check=True)


def test_first_deploy_pushes_this_archs_files_second_deploy_nothing(device, bundle):
    first = deploy(device, bundle)
    wanted = bundle.files_for("v75")
    assert _pushed_names(device) == sorted(f.name for f in wanted)
    assert (first.files_pushed, first.files_skipped, first.files_hashed) == (len(wanted), 0, 0)
    assert sorted(first.pushed) == sorted(f.name for f in wanted)
    ws = _ws(device, bundle)
    for f in wanted:
        assert (ws / f.name).read_bytes() == f.path.read_bytes()
    assert (ws / "libQnnHtp.so").read_text() == "htp v75"  # the SM8650's own, not the v73 one
    assert os.access(ws / "qnn_llama_runner", os.X_OK)
    assert not list(ws.glob("*" + PARTIAL_SUFFIX + "*"))
    record = json.loads((ws / RECORD_NAME).read_text())
    assert record["bundle"] == "plan" and set(record["files"]) == {f.name for f in wanted}

    device.pushes.clear()
    calls = len(device.commands)
    second = deploy(device, bundle)
    assert device.pushes == [] and device.hashed() == []  # the record vouches for every file
    assert (second.files_pushed, second.files_skipped, second.files_hashed) == (0, len(wanted), 0)
    assert len(device.commands) - calls == 1  # one probe, nothing else


def test_a_file_changed_on_the_device_is_hashed_and_pushed_again(device, bundle):
    deploy(device, bundle)
    target = _ws(device, bundle) / "kv.pte"
    original = target.read_bytes()
    target.write_bytes(b"X" * len(original))  # same size, new mtime
    device.pushes.clear()
    report = deploy(device, bundle)
    assert device.hashed() == ["kv.pte"] and report.files_hashed == 1
    assert _pushed_names(device) == ["kv.pte"] and report.pushed == ["kv.pte"]
    assert target.read_bytes() == original


def test_fast_trusts_restored_mtime_full_hashes_everything(device, bundle):
    deploy(device, bundle)
    target = _ws(device, bundle) / "kv.pte"
    st = target.stat()
    target.write_bytes(b"Y" * st.st_size)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # tampering that restores the mtime
    device.pushes.clear()
    assert deploy(device, bundle).files_pushed == 0  # fast: size and mtime match the record
    report = deploy(device, bundle, verify="full")
    assert sorted(device.hashed()) == sorted(f.name for f in bundle.files_for("v75"))
    assert report.pushed == ["kv.pte"] and target.read_bytes().startswith(b"kv-model")


def test_without_a_record_files_are_hashed_not_pushed(device, bundle):
    deploy(device, bundle)
    ws = _ws(device, bundle)
    (ws / RECORD_NAME).unlink()
    (ws / ("kv.pte" + PARTIAL_SUFFIX)).write_bytes(b"half a push")  # a leftover of a killed deploy
    device.pushes.clear()
    report = deploy(device, bundle)
    assert _pushed_names(device) == [] and report.files_hashed == len(bundle.files_for("v75"))
    assert (ws / RECORD_NAME).is_file() and not (ws / ("kv.pte" + PARTIAL_SUFFIX)).exists()


def test_device_of_an_arch_the_bundle_lacks_is_refused_before_any_command(tmp_path, bundle):
    device = FakeDevice(tmp_path / "old", soc="SM8450")  # v69; the bundle has v73 and v75
    with pytest.raises(UsageError, match="v73, v75 only.*SM8450.*v69"):
        deploy(device, bundle)
    assert device.commands == [] and device.pushes == []


def test_not_enough_space_pushes_nothing(tmp_path, bundle):
    device = FakeDevice(tmp_path / "full", programs={"df": FULL_DISK_DF})
    with pytest.raises(AdbError, match="1024 bytes free, deploy needs"):
        deploy(device, bundle)
    assert device.pushes == []


def test_a_host_file_changed_since_the_manifest_is_refused_and_not_recorded(device, bundle):
    pte = next(f for f in bundle.files if f.name == "kv.pte")
    pte.path.write_bytes(b"Z" * pte.size)  # same size, other bytes
    with pytest.raises(UsageError, match="changed or is corrupt"):
        deploy(device, bundle)
    ws = _ws(device, bundle)
    assert not (ws / "kv.pte").exists() and not list(ws.glob("*" + PARTIAL_SUFFIX + "*"))
    assert not (ws / RECORD_NAME).exists()


# -- runs ---------------------------------------------------------------------------------------


@pytest.fixture
def deployed(device, bundle):
    deploy(device, bundle)
    return device, bundle


def test_run_parses_outputs_speed_and_observer(deployed, tmp_path):
    device, bundle = deployed
    prompts = ["it's $(touch pwned)", "line\nbreak", "--prompt"]
    result = run(device, bundle, RunRequest(prompts=prompts, mode="hybrid", updater="ShiftPointer"),
                 timeout=60, local_dir=tmp_path / "out")
    report = json.loads(result.text)
    assert report["prompts"] == prompts and report["model"].startswith("hybrid-model")
    argv = report["argv"]
    assert argv[argv.index("--kv_updater") + 1] == "ShiftPointer"
    assert argv[argv.index("--eval_mode") + 1] == "1"
    assert report["cwd"] == str(_ws(device, bundle))
    assert result.tokens_per_s == 50.0 and result.exit_code == 0  # the fake's ShiftPointer figure
    assert result.observer["generated_tokens"] == 11
    assert result.decode_tok_s == pytest.approx(11 / 0.5) and result.prefill_tok_s == pytest.approx(100)
    assert result.generated_ids is None  # qnn-v1.0 writes no token ids
    assert (tmp_path / "out" / "outputs.txt").read_bytes() == result.text_bytes
    assert not list(_ws(device, bundle).glob("pwned*"))
    assert not list((_ws(device, bundle) / "runs").iterdir())  # the run's directory is removed


def test_runner_exit_code_is_a_failure_with_stderr(deployed):
    device, bundle = deployed
    with pytest.raises(RunnerFailed, match="exited 7: fake runner: cannot load model") as info:
        run(device, bundle, RunRequest(prompts=["FAIL"]), timeout=60)
    assert info.value.result.exit_code == 7


def test_exit_zero_without_outputs_is_incomplete(deployed):
    device, bundle = deployed
    runner = _ws(device, bundle) / "qnn_llama_runner"
    runner.write_text("#!/bin/sh\necho 'nothing written' >&2\n")
    with pytest.raises(RunIncomplete, match="no outputs.txt.*nothing written"):
        run(device, bundle, RunRequest(prompts=["hi"]), timeout=60)


def test_timeout_kills_the_runner_and_removes_the_run(deployed):
    device, bundle = deployed
    with pytest.raises(DeviceTimeout):
        run(device, bundle, RunRequest(prompts=["HANG"]), timeout=0.5)  # it never ends: any bound
    assert "kill -9" in device.commands[-1] and "rm -rf" in device.commands[-1]
    assert not list((_ws(device, bundle) / "runs").iterdir())
