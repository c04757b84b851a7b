"""A failed test's evidence from its device (farm.device.evidence), on a scripted stand-in phone.

The stand-in answers the commands a phone answers (``date``, ``logcat``, the tombstone listing,
``dumpsys``) from a table, records every command, and runs each through ``sh -n`` first, so a command
that a shell could not even parse (a quoting slip) fails the test.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from farm.device import evidence
from farm.device.transport import ShellResult
from farm.errors import DeviceGone, DeviceTimeout, LeaseLost

START = "1764638400.123456789"
LISTING_BEFORE = "1764630000 4000 tombstone_00\n1764630100 5000 tombstone_01\n"
LISTING_AFTER = ("1764630000 4000 tombstone_00\n1764638401 9000 tombstone_01\n"
                 "1764638402 7000 tombstone_02\n")
LOGCAT = (b"12-02 01:20:00.200   231   231 I farm-llama-runner: start pid 231\n"
          b"12-02 01:20:01.118   231   231 F libc    : Fatal signal 11 (SIGSEGV)\n")


@dataclass
class ScriptedPhone:
    """Answers by the first word(s) of a command: (exit code, stdout, stderr) or an exception."""

    answers: dict[str, object]
    commands: list[str] = field(default_factory=list)
    serial: str = "R5CW1234ABC"
    workspace: str = "/data/local/tmp/ptefarm"
    soc: str | None = "SM8650"
    htp_arch: str | None = "v75"

    def shell(self, command: str, *, timeout: float, check: bool = False) -> ShellResult:
        assert timeout > 0
        parsed = subprocess.run(["sh", "-n", "-c", command], capture_output=True, text=True)
        assert parsed.returncode == 0, f"not valid shell: {command!r}: {parsed.stderr}"
        self.commands.append(command)
        for prefix, answer in self.answers.items():
            if command.startswith(prefix):
                if isinstance(answer, Exception):
                    raise answer
                if callable(answer):
                    answer = answer(command)
                rc, out, err = answer
                out = out if isinstance(out, bytes) else out.encode()
                return ShellResult(command, rc, out, err.encode())
        return ShellResult(command, 127, b"", f"/system/bin/sh: {command.split()[0]}: not found".encode())

    def push(self, *a, **k):  # pragma: no cover - evidence never writes to the device
        raise AssertionError("evidence pushed to the device")

    def read_file(self, *a, **k):  # pragma: no cover
        raise AssertionError("evidence read a file outside shell's bounds")


@dataclass
class Run:
    command: str
    exit_code: int
    stdout: str
    stderr: str


def phone(listing_now: str = LISTING_AFTER, **extra) -> ScriptedPhone:
    listings = iter([LISTING_BEFORE, listing_now])
    answers: dict[str, object] = {
        "date +%s.%N": (0, START + "\n", ""),
        "cd /data/tombstones": lambda c: (0, next(listings), ""),
        "logcat -d -b all": (0, LOGCAT, ""),
        "head -c": lambda c: (0, f"*** tombstone {shlex.split(c)[-1]}\nsignal 11 (SIGSEGV)\n", ""),
        "dumpsys battery": (0, "Current Battery Service state:\n  temperature: 310\n", ""),
        "dumpsys thermalservice": (0, "IsStatusOverride: false\nThermal Status: 0\n", ""),
    }
    # The test's own answers are matched first (a prefix of them may cover several of these).
    return ScriptedPhone({**extra, **{k: v for k, v in answers.items() if k not in extra}})


def test_logcat_is_every_buffer_in_threadtime_since_the_devices_clock_at_the_start():
    device = phone()
    start = evidence.mark(device)
    assert start.since == "1764638400.123"
    ev = evidence.collect(device, start)
    command = next(c for c in device.commands if c.startswith("logcat"))
    argv = shlex.split(command.partition("|")[0])
    assert argv == ["logcat", "-d", "-b", "all", "-v", "threadtime", "-t", "1764638400.123"]
    assert ev.files["logcat.txt"] == LOGCAT
    assert all("-c" not in shlex.split(c.partition("|")[0]) for c in device.commands
               if c.startswith("logcat")), "evidence must not clear the device's logs"


def test_only_tombstones_written_or_rewritten_during_the_test_are_kept():
    device = phone()
    ev = evidence.collect(device, evidence.mark(device))
    assert sorted(n for n in ev.files if n.startswith("tombstone")) == ["tombstone_01", "tombstone_02"]
    assert b"/data/tombstones/tombstone_02" in ev.files["tombstone_02"]
    assert not ev.warnings


def test_an_unreadable_tombstone_directory_falls_back_to_the_crash_buffer():
    crash = b"12-02 01:20:01.118   231   231 F DEBUG   : pid: 231, name: farm-llama-runner\n"
    device = phone(**{"cd /data/tombstones": (1, "", "cd: /data/tombstones: Permission denied"),
                      "logcat -d -b crash": (0, crash, "")})
    ev = evidence.collect(device, evidence.mark(device))
    assert ev.files["crash.txt"] == crash
    assert not any(n.startswith("tombstone") for n in ev.files)
    assert any("Permission denied" in w for w in ev.warnings)
    assert any("crash buffer" in w for w in ev.warnings)


def test_battery_and_thermal_state_are_captured():
    device = phone()
    ev = evidence.collect(device, evidence.mark(device))
    assert b"temperature: 310" in ev.files["battery.txt"]
    assert b"Thermal Status: 0" in ev.files["thermal.txt"]


def test_runner_invocations_keep_command_line_exit_code_and_both_streams():
    device = phone()
    runs = [Run("cd /w && ./qnn_llama_runner --prompt 'a b'", 139, "Once upon", "Segmentation fault")]
    ev = evidence.collect(device, evidence.mark(device), runs)
    text = ev.files["runner-1.txt"].decode()
    assert text.startswith("$ cd /w && ./qnn_llama_runner --prompt 'a b'\nexit code: 139\n")
    assert "Once upon" in text and "Segmentation fault" in text


def test_evidence_is_bounded_and_keeps_the_end_of_logcat_and_of_runner_output():
    big = b"x" * (evidence.LOGCAT_BYTES + 5000) + b"LAST LINE\n"
    device = phone(**{"logcat -d -b all": (0, big, "")})
    runs = [Run(f"run {i}", 1, "o" * (evidence.RUNNER_BYTES * 2) + "END OUT", "e")
            for i in range(evidence.MAX_RUNS + 2)]
    ev = evidence.collect(device, evidence.mark(device), runs)
    assert len(ev.files["logcat.txt"]) < evidence.LOGCAT_BYTES + 100
    assert ev.files["logcat.txt"].endswith(b"LAST LINE\n")
    runner_files = sorted(n for n in ev.files if n.startswith("runner-"))
    assert len(runner_files) == evidence.MAX_RUNS
    assert "runner-10.txt" in runner_files  # the last invocations, numbered as the test made them
    assert "END OUT" in ev.files["runner-10.txt"].decode()
    assert len(ev.files["runner-10.txt"]) < 2 * evidence.RUNNER_BYTES + 1000
    # the logcat transfer itself is bounded on the device
    assert "| tail -c" in next(c for c in device.commands if c.startswith("logcat"))


@pytest.mark.parametrize("trouble", [DeviceGone("device R5CW1234ABC is gone", serial="R5CW1234ABC"),
                                     LeaseLost("lease of R5CW1234ABC ended"), RuntimeError("bug")])
def test_a_device_that_fails_mid_capture_is_a_warning_never_an_exception(trouble):
    device = phone(**{"logcat -d": trouble, "dumpsys": trouble})
    ev = evidence.collect(device, evidence.mark(device), [Run("r", 1, "", "boom")])
    assert "runner-1.txt" in ev.files  # what the host has is kept
    assert any(type(trouble).__name__ in w and "logcat" in w for w in ev.warnings)


def test_a_device_that_stops_answering_costs_one_timeout_not_one_per_command():
    hung = DeviceTimeout("`logcat -d ...` on R5CW1234ABC: no answer in 30 s", serial="R5CW1234ABC")
    device = phone(**{"logcat -d": hung})
    ev = evidence.collect(device, evidence.mark(device), [Run("r", 1, "", "")])
    asked = device.commands[2:]  # after the mark's two
    assert len(asked) == 1 and asked[0].startswith("logcat"), asked
    assert any("skipped" in w and "DeviceTimeout" in w and "dumpsys battery" in w for w in ev.warnings)
    assert "runner-1.txt" in ev.files


def test_a_device_gone_at_the_start_still_gives_evidence_of_what_the_host_holds():
    gone = DeviceGone("gone", serial="x")
    device = ScriptedPhone({"": gone})
    start = evidence.mark(device)
    assert start.since is None and start.tombstones is None
    ev = evidence.collect(device, start, [Run("r", 1, "out", "err")])
    assert set(ev.files) == {"runner-1.txt"}
    assert any("clock" in w for w in ev.warnings)


def test_a_clock_without_nanoseconds_gives_whole_seconds():
    device = phone(**{"date +%s.%N": (0, "1764638400.N\n", "")})
    assert evidence.mark(device).since == "1764638400.000"


def test_written_evidence_holds_the_warnings_beside_the_files(tmp_path: Path):
    ev = evidence.Evidence({"logcat.txt": b"l\n"}, ["thermal: not captured"])
    written = ev.write(tmp_path / "e")
    assert sorted(p.name for p in written) == ["capture-warnings.txt", "logcat.txt"]
    assert (tmp_path / "e" / "capture-warnings.txt").read_text() == "thermal: not captured\n"


def test_test_ids_become_distinct_directory_names():
    a = evidence.safe_dir_name("suites/test_correctness.py::test_updaters_agree[SM8650-hybrid]")
    assert a == "suites_test_correctness.py_test_updaters_agree_SM8650-hybrid"
    long1, long2 = ("t.py::test_" + "x" * 300 + "[a]"), ("t.py::test_" + "x" * 300 + "[b]")
    assert evidence.safe_dir_name(long1) != evidence.safe_dir_name(long2)
    assert len(evidence.safe_dir_name(long1)) <= 120
    assert evidence.safe_dir_name("../../etc") == "etc"
