"""Running a runner on a virtual device: quoting, outputs, failures, timeouts, vanishing devices.

The bundle is hand-made with a fake ``qnn_llama_runner`` (tests/support/devices.py) that writes what it
received as outputs.txt, so the tests see the runner's argv and environment byte for byte.
"""

from __future__ import annotations

import json
import time

import pytest

from farm.bundle import manifest as bundle_mod
from farm.device.discovery import find_device
from farm.errors import DeviceTimeout, InfraError
from farm.execute.deploy import bundle_workspace, deploy
from farm.execute.run import RunnerFailed, run
from farm.execute.runprofile import RunRequest
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from tests.support.devices import alongside, bundles_per_dialect, make_qnn_bundle

HOSTILE = ["it's \"quoted\"", "$(touch pwned) `touch pwned2`; touch pwned3 && echo $HOME | cat",
           "line one\nline two\r\n\ttab", "héllo wörld — 日本語 🦙", "--prompt", "", "\\\\ \\n '",
           "*", "> redirected"]


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    manifests = bundles_per_dialect(root, "fake")
    with VirtualFarm(home=root / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        device = find_device([vf.adb_server], record.serial)
        bundles = {d: bundle_mod.load(m) for d, m in manifests.items()}
        for b in bundles.values():
            deploy(device, b)
        yield vf, device, bundles


def test_hostile_prompts_reach_the_runner_byte_exact(fake, tmp_path):
    vf, device, bundles = fake
    bundle = bundles["qnn-v1.0"]
    result = run(device, bundle, RunRequest(prompts=HOSTILE, system_prompt="sys 'x' $(y)",
                                            mode="hybrid", updater="ShiftPointer"),
                 timeout=60, local_dir=tmp_path / "out")
    report = json.loads(result.text)
    assert report["prompts"] == HOSTILE
    argv = report["argv"]
    assert argv[argv.index("--system_prompt") + 1] == "sys 'x' $(y)"
    assert argv[argv.index("--kv_updater") + 1] == "ShiftPointer"
    assert argv[argv.index("--eval_mode") + 1] == "1"
    assert report["model"].startswith("hybrid-model")  # the runner opened the deployed .pte
    assert report["env"] == {"LD_LIBRARY_PATH": ".", "ADSP_LIBRARY_PATH": "."}
    assert report["cwd"] == bundle_workspace(device, bundle)  # the device's path, as it sees it
    ws = vf.host_path(device.serial, bundle_workspace(device, bundle))
    assert not list(ws.glob("pwned*")) and not (ws / "redirected").exists()  # nothing was executed
    assert result.exit_code == 0 and result.serial == device.serial
    assert result.tokens_per_s == 50.0  # the fake runner's figure for ShiftPointer
    assert result.observer["generated_tokens"] == 11
    assert result.decode_tok_s == pytest.approx(11 / 0.5)
    assert result.prompt_ids is None  # qnn runners do not write token ids
    assert (tmp_path / "out" / "outputs.txt").read_text() == result.text
    assert not (ws / "runs").exists() or not list((ws / "runs").iterdir())  # run dir cleaned


def test_shared_buffer_dialect_passes_its_flag(fake):
    _, device, bundles = fake
    result = run(device, bundles["qnn-v1.4"], RunRequest(prompts=["hi"]), timeout=60)
    argv = json.loads(result.text)["argv"]
    assert "--shared_buffer" in argv and "--kv_updater" not in argv


def test_failing_runner_is_runner_failed_not_infra(fake):
    _, device, bundles = fake
    with pytest.raises(RunnerFailed, match="exited 7: fake runner: cannot load model") as caught:
        run(device, bundles["qnn-v1.0"], RunRequest(prompts=["FAIL"]), timeout=60)
    assert not isinstance(caught.value, InfraError)
    assert isinstance(caught.value, AssertionError)  # counted as a test failure
    assert caught.value.result.exit_code == 7
    assert "cannot load model" in caught.value.result.stderr


def test_hung_runner_is_killed_at_the_timeout(fake):
    vf, device, bundles = fake
    bundle = bundles["qnn-v1.0"]
    run_dir = vf.host_path(device.serial, bundle_workspace(device, bundle)) / "runs" / "hang-1"
    pids: list[int] = []

    def read_pid() -> None:  # the run dir is removed after the kill: read the pid while it runs
        deadline = time.monotonic() + 30
        while not pids and time.monotonic() < deadline:
            try:
                pids.append(int((run_dir / "runner.pid").read_text()))
            except (OSError, ValueError):
                time.sleep(0.05)

    with alongside(read_pid), pytest.raises(DeviceTimeout):
        run(device, bundle, RunRequest(prompts=["HANG"]), timeout=2, out_name="hang-1")
    assert not run_dir.exists(), "the timed-out run's directory is left on the device"
    (pid,) = pids  # a pid of the device's own pid namespace: ask the device

    def alive() -> bool:
        return device.shell(f"kill -0 {pid} 2>/dev/null && echo alive; true", timeout=10).out.strip() \
            == "alive"

    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(), "the hung runner is still alive"
    # The device is still usable for the next run.
    assert run(device, bundle, RunRequest(prompts=["after"]), timeout=60).exit_code == 0


def test_device_killed_mid_run_is_infra(tmp_path):
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="kill-test"))
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        device = find_device([vf.adb_server], record.serial)
        deploy(device, bundle)
        pidfile = vf.host_path(record.serial, bundle_workspace(device, bundle)) / "runs" / "victim" \
            / "runner.pid"

        def kill_when_running() -> None:
            deadline = time.monotonic() + 30
            while not pidfile.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            vf.kill(record.serial)

        with alongside(kill_when_running), pytest.raises(InfraError):
            run(device, bundle, RunRequest(prompts=["HANG"]), timeout=60, out_name="victim")
