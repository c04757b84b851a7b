"""What a run brings back and what it leaves behind (FakeDevice: no adb, no virtual device).

A run's result carries exactly what the runner left (output bytes, speed, token ids, stdout, stderr,
the observer lines) and where it ran; the runner gets the run's timeout and every other device call
the I/O timeout; the run's directory is removed unless asked to keep it, also after a timeout, when the
runner is killed; a runner that exits 0 without outputs is ``RunIncomplete`` with a message that names
the device, what is missing, where and the stderr tail.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from farm.errors import AdbError, DeviceTimeout, InfraError, RunIncomplete
from farm.execute import run as run_mod
from farm.execute.deploy import bundle_workspace, deploy
from farm.execute.run import KILL_TIMEOUT_S, RunnerFailed, RunResult, new_out_name, run
from tests.execute.run_support import RecordingDevice, scripted, scripted_bundle
from tests.support.runner_help_texts import HOST_RUNNER, QNN_V1_0_1

OBSERVED = {"prompt_tokens": 4, "generated_tokens": 3, "inference_start_ms": 0, "prompt_eval_end_ms": 100,
            "first_token_ms": 100, "inference_end_ms": 300}
STORY = "Once upon a time, a llama 🦙"


@pytest.fixture(autouse=True)
def fresh_help_cache(monkeypatch):
    monkeypatch.setattr(run_mod, "_HELP", {})


def _deployed(tmp_path: Path, help_text: str, name: str) -> tuple[RecordingDevice, object]:
    bundle = scripted_bundle(tmp_path / name, name, help_text)
    device = RecordingDevice(tmp_path / "device", serial="rec-1")
    deploy(device, bundle)
    device.calls.clear()
    return device, bundle


@pytest.fixture
def host(tmp_path):
    """A bundle whose runner speaks the host runner's dialect: it writes token ids."""
    return _deployed(tmp_path, HOST_RUNNER, "host-like")


@pytest.fixture
def qnn(tmp_path):
    """A bundle whose runner is a stock qnn_llama_runner v1.0.1: outputs.txt only, no token ids."""
    return _deployed(tmp_path, QNN_V1_0_1, "qnn-like")


def _run_dir(device, bundle, name: str) -> Path:
    return Path(bundle_workspace(device, bundle)) / "runs" / name


def test_a_run_brings_back_what_the_runner_left(host):
    device, bundle = host
    request = scripted(text=STORY, speed="12.5\n", ids={"prompt_ids": [1, 2], "generated_ids": [7, 8, 9]},
                       stdout=f"loading\nPyTorchObserver {json.dumps(OBSERVED)}\n", stderr="warming up\n",
                       mode="hybrid", updater="ShiftPointer")
    before = time.monotonic()
    result = run(device, bundle, request, timeout=60)
    elapsed = time.monotonic() - before
    (runner_command,) = device.runner_calls()
    assert (result.serial, result.bundle, result.mode, result.updater) == \
        ("rec-1", "host-like", "hybrid", "ShiftPointer")
    assert result.command == runner_command and result.exit_code == 0
    assert result.stdout.startswith("loading\nPyTorchObserver ") and result.stderr == "warming up\n"
    assert result.text == STORY and result.text_bytes == STORY.encode()
    assert result.tokens_per_s == 12.5
    assert result.observers == [OBSERVED]
    assert (result.prompt_ids, result.generated_ids) == ([1, 2], [7, 8, 9])
    assert 0 <= result.duration_s <= elapsed
    assert result.local_dir is None and result.to_dict()["local_dir"] is None


def test_outputs_that_are_not_utf8_are_kept_as_written_and_shown_replaced(qnn):
    device, bundle = qnn
    result = run(device, bundle, scripted(text=b"caf\xe9 \xff!"), timeout=60)
    assert result.text_bytes == b"caf\xe9 \xff!"
    assert result.text == "caf\ufffd \ufffd!"


def test_the_pulled_files_and_both_streams_are_also_written_to_local_dir(host, tmp_path):
    device, bundle = host
    local = tmp_path / "reports" / "run-1"  # missing parents are made
    ids = {"prompt_ids": [1], "generated_ids": [5, 6]}
    for text in ("first", "second"):  # the folder may exist already: the later run's files win
        result = run(device, bundle, scripted(text=text, speed="3.0", ids=ids, stderr=f"{text} err\n"),
                     timeout=60, local_dir=local)
    assert result.local_dir == local and result.to_dict()["local_dir"] == str(local)
    assert sorted(p.name for p in local.iterdir()) == \
        ["inference_speed.txt", "outputs.txt", "stderr.txt", "stdout.txt", "token_ids.json"]
    assert (local / "outputs.txt").read_bytes() == b"second"
    assert (local / "inference_speed.txt").read_bytes() == b"3.0"
    assert json.loads((local / "token_ids.json").read_bytes()) == ids
    assert (local / "stdout.txt").read_bytes() == result.stdout.encode()
    assert (local / "stderr.txt").read_bytes() == b"second err\n"


def test_the_runner_gets_the_run_timeout_and_every_other_device_call_the_io_timeout(host):
    device, bundle = host
    run(device, bundle, scripted(text="hi", speed="1.0", ids={"generated_ids": [1]}),
        timeout=123.0, io_timeout=7.0)  # 7 s: under any cap the --help may have of its own
    runner = device.runner_calls()
    assert len(runner) == 1 and len(device.help_calls()) == 1
    assert [t for _, c, t in device.calls] == [123.0 if c in runner else 7.0 for _, c, _ in device.calls]
    assert {c.split()[0] for what, c, _ in device.calls if what == "shell" and c not in runner} >= \
        {"ls", "rm"}  # the listing of the outputs and the removal of the run's directory
    assert len([c for c in device.calls if c[0] == "read"]) == 3  # outputs, speed, token ids


def test_the_run_directory_is_removed_unless_kept(qnn):
    device, bundle = qnn
    run(device, bundle, scripted(text="gone"), timeout=60, out_name="removed")
    assert not _run_dir(device, bundle, "removed").exists()
    run(device, bundle, scripted(text="kept"), timeout=60, out_name="kept", keep_remote=True)
    assert (_run_dir(device, bundle, "kept") / "outputs.txt").read_text() == "kept"


def test_each_run_has_its_own_directory_named_for_when_it_started():
    names = {new_out_name() for _ in range(20)}
    assert len(names) == 20
    assert all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{8}", n) for n in names), names


def test_runs_without_a_name_do_not_share_a_directory(qnn):
    device, bundle = qnn
    for text in ("one", "two"):
        run(device, bundle, scripted(text=text), timeout=60, keep_remote=True)
    runs = Path(bundle_workspace(device, bundle)) / "runs"
    assert sorted((d / "outputs.txt").read_text() for d in runs.iterdir()) == ["one", "two"]


# -- a runner that exits 0 without outputs ---------------------------------------------------------

INCOMPLETE = {
    "no outputs.txt": ("qnn", dict(ids={"generated_ids": [1]})),
    "an empty outputs.txt": ("qnn", dict(text="")),
    "no readable token_ids.json": ("host", dict(text="story", ids="[not json")),
    "no generated tokens in token_ids.json": ("host", dict(text="story", ids={"generated_ids": []})),
}


@pytest.mark.parametrize("missing", list(INCOMPLETE))
def test_a_runner_exiting_0_without_outputs_is_run_incomplete_naming_what_is_missing(request, missing):
    which, script = INCOMPLETE[missing]
    device, bundle = request.getfixturevalue(which)
    with pytest.raises(RunIncomplete) as caught:
        run(device, bundle, scripted(stderr="loaded\n\nno memory for KV\n", **script), timeout=60,
            out_name="r1")
    e = caught.value
    out_dir = posixpath.join(bundle_workspace(device, bundle), "runs", "r1")
    assert str(e) == (f"runner on rec-1 exited 0 but left {missing} in {out_dir} (kv/SmartMask); "
                      f"stderr: loaded | no memory for KV")
    assert isinstance(e, InfraError) and not isinstance(e, AssertionError)  # an error, never a pass
    assert (e.serial, e.exit_code, e.missing) == ("rec-1", 0, missing)
    assert e.stderr_tail == "loaded | no memory for KV"
    assert isinstance(e.result, RunResult) and e.result.stderr == "loaded\n\nno memory for KV\n"


def test_a_runner_exiting_0_with_outputs_and_tokens_is_a_result(host, qnn):
    assert run(*host, scripted(text="s", ids={"generated_ids": [4]}), timeout=60).generated_ids == [4]
    assert run(*qnn, scripted(text="s"), timeout=60).generated_ids is None  # no ids: none expected


def test_a_failing_runner_names_the_device_the_exit_code_and_the_stderr_tail(qnn):
    device, bundle = qnn
    with pytest.raises(RunnerFailed) as caught:
        run(device, bundle, scripted(text="partial", code=3, stderr="a\nb\n"), timeout=60)
    assert str(caught.value) == "runner on rec-1 exited 3: a | b"
    assert caught.value.result.text == "partial"


# -- a runner that does not finish in time ---------------------------------------------------------

class HungConnection:
    """Stands in for the adb connection of a runner that hangs: the runner is started and left
    running (as an adbd that does not hang up on a closed stream leaves it), then the call times out."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def __call__(self, device: RecordingDevice, command: str, timeout: float):
        self.proc = subprocess.Popen(["sh", "-c", command], cwd=device.root, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pidfile = re.search(r"echo \$\$ > (\S+)", command).group(1)  # relative to the workspace
        deadline = time.monotonic() + 60
        while not list(device.root.glob(f"*/{pidfile}")):
            assert time.monotonic() < deadline and self.proc.poll() is None, "the runner did not start"
            time.sleep(0.02)
        raise DeviceTimeout(f"device {device.serial}: command did not finish in {timeout:g} s",
                            serial=device.serial)

    def killed(self) -> bool:
        """Whether the runner was killed (SIGKILL); waits for it to end (it must, once killed)."""
        try:
            return self.proc.wait(timeout=30) == -signal.SIGKILL
        except subprocess.TimeoutExpired:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def hung(qnn):
    device, bundle = qnn
    connection = HungConnection()
    device.runner_stand_in = connection
    yield device, bundle, connection
    connection.stop()


@pytest.mark.parametrize("keep_remote", [False, True], ids=["removed", "kept"])
def test_a_timed_out_runner_is_killed_and_its_directory_removed_unless_kept(hung, keep_remote):
    device, bundle, connection = hung
    with pytest.raises(DeviceTimeout):
        run(device, bundle, scripted(text="never", sleep=120), timeout=5, out_name="slow",
            keep_remote=keep_remote)
    assert connection.killed(), "the timed-out runner is still alive"
    assert _run_dir(device, bundle, "slow").exists() == keep_remote
    what, command, timeout = device.calls[-1]  # the clean-up: bounded on its own, not by the run
    assert what == "shell" and "kill -9" in command and timeout == KILL_TIMEOUT_S


def test_a_timeout_is_reported_as_such_when_the_cleanup_fails_too(hung, caplog):
    device, bundle, connection = hung
    cleanup_error = AdbError("device rec-1: connection reset", serial="rec-1")
    device.fail = lambda command: cleanup_error if "kill -9" in command else None
    with caplog.at_level(logging.WARNING, logger="farm.execute.run"), \
            pytest.raises(DeviceTimeout, match="did not finish in 5 s"):
        run(device, bundle, scripted(text="never", sleep=120), timeout=5, out_name="slow")
    assert [r.getMessage() for r in caplog.records] == \
        ["device rec-1: cleaning up after a timed-out run failed: device rec-1: connection reset"]
