"""A virtual device keeps a phone's logcat: ring buffers fed by its own events (boot, the runner's start
and exit, a native crash's lines), ``log -t``, and logcat's dump, clear, buffers, tail, tag filters
and threadtime format; a runner killed by a crash signal leaves a tombstone in /data/tombstones."""

from __future__ import annotations

import re
import shlex
import time

import pytest

from farm.bundle import manifest as bundle_mod
from farm.execute.runprofile import RunRequest, runner_argv
from farm.virtual import VirtualDeviceSpec
from farm.virtual.confine import RUNNER_ZYGOTE_SOCKET
from farm.virtual.logd import LogBuffers

# liblog's FORMAT_THREADTIME: "%s %5d %5d %c %-8s: " with the time as "%m-%d %H:%M:%S.mmm".
THREADTIME = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) ([ \d]{5}) ([ \d]{5}) ([VDIWEF]) (.{8,}?): (.*)")
WRAPPER = '#!/system/bin/sh\nexec farm-llama-runner "$@"\n'


@pytest.fixture(scope="module")
def phone(tmp_path_factory):
    from farm.virtual import VirtualFarm

    with VirtualFarm(home=tmp_path_factory.mktemp("logcat")) as vf:
        (dev,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        yield vf, dev


def _sh(phone, command: str, timeout: float = 60):
    vf, dev = phone
    return vf.client().device(dev.serial).shell2(command, v2=True, timeout=timeout)


def _entries(text: str) -> list[tuple[str, int, int, str, str, str]]:
    """Parsed threadtime lines (dividers skipped); every other line fails the test."""
    found = []
    for line in text.splitlines():
        if line.startswith("--------- beginning of "):
            continue
        m = THREADTIME.fullmatch(line)
        assert m, f"not a threadtime line: {line!r}"
        found.append((m[1], int(m[2]), int(m[3]), m[4], m[5].rstrip(), m[6]))
    return found


def test_log_lines_in_threadtime_format(phone):
    r = _sh(phone, "log -t FarmTest 'hello from a script' && echo pid=$$; logcat -d")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "--------- beginning of main" in lines
    mine = [e for e in _entries(r.stdout.split("\n", 1)[1]) if e[4] == "FarmTest"]
    assert len(mine) == 1
    stamp, pid, tid, prio, tag, msg = mine[0]
    assert (prio, msg) == ("I", "hello from a script") and pid == tid > 0
    assert time.strftime("%m-%d") in stamp or stamp  # local time of the device
    # The exact layout: pid and tid right-aligned in 5 columns, the tag padded to 8.
    line = next(x for x in lines if "FarmTest" in x)
    assert line[18:] == f" {pid:5d} {tid:5d} I FarmTest: hello from a script"


def test_clear_empties_the_buffers(phone):
    _sh(phone, "log -t BeforeClear x")
    assert _sh(phone, "logcat -c").returncode == 0
    r = _sh(phone, "logcat -d")
    assert r.returncode == 0 and "BeforeClear" not in r.stdout
    _sh(phone, "log -t AfterClear y")
    assert [e[4] for e in _entries(_sh(phone, "logcat -d").stdout)] == ["AfterClear"]


def test_tag_filters_and_priorities(phone):
    _sh(phone, "logcat -c; log -t Keep -p w warned; log -t Keep -p d debugged; log -t Other noise")
    only_keep = _entries(_sh(phone, "logcat -d Keep:I '*:S'").stdout)
    assert [(e[4], e[3], e[5]) for e in only_keep] == [("Keep", "W", "warned")]
    both = _entries(_sh(phone, "logcat -d -s Keep Other").stdout)
    assert [e[5] for e in both] == ["warned", "debugged", "noise"]
    brief = _sh(phone, "logcat -d -v brief Other:V *:S").stdout.splitlines()
    assert brief[-1] == f"I/Other   ({_entries(_sh(phone, 'logcat -d Other *:S').stdout)[0][1]:5d}): noise"


def test_buffers_and_tail(phone):
    _sh(phone, "logcat -c; log -t T1 one; log -t T2 two; log -t T3 three; log -b system -t Sys s")
    assert [e[5] for e in _entries(_sh(phone, "logcat -d -b main").stdout)] == ["one", "two", "three"]
    assert [e[5] for e in _entries(_sh(phone, "logcat -d -b system").stdout)] == ["s"]
    assert [e[5] for e in _entries(_sh(phone, "logcat -t 2 -b main").stdout)] == ["two", "three"]
    # -T N prints the last N, then follows until killed
    r = _sh(phone, "logcat -T 1 -b main > /data/local/tmp/follow.txt & p=$!; sleep 2; log -t T4 four; "
                   "sleep 2; kill $p; cat /data/local/tmp/follow.txt")
    assert [e[5] for e in _entries(r.stdout)] == ["three", "four"]


def test_bad_arguments_are_refused(phone):
    r = _sh(phone, "logcat -d -b nosuch")
    assert r.returncode == 1 and "unknown buffer 'nosuch'" in r.stderr
    r = _sh(phone, "logcat -d 'Tag:Q'")
    assert r.returncode == 1 and "Invalid filter expression" in r.stderr


def test_ring_buffer_is_bounded():
    buffers = LogBuffers(limit=4096)
    for i in range(1000):
        buffers.write("main", 4, "Tag", f"message {i:04d} " + "x" * 40)
    kept = buffers.snapshot(["main"])
    assert 0 < buffers.sizes(["main"])["main"] <= 4096
    assert kept[-1].msg.startswith("message 0999") and len(kept) < 100


def _push_bundle(phone, tiny_bundle, ws: str, tmp_path):
    vf, dev = phone
    bundle = bundle_mod.load(tiny_bundle)
    adb = vf.client().device(dev.serial)
    adb.shell2(f"rm -rf {ws} && mkdir -p {ws}", v2=True, timeout=30)
    for f in bundle.files:
        adb.sync.push(str(f.path), f"{ws}/{f.name}")
    wrapper = tmp_path / "qnn_llama_runner"
    wrapper.write_text(WRAPPER)
    adb.sync.push(str(wrapper), f"{ws}/qnn_llama_runner", mode=0o755)
    argv, _ = runner_argv(bundle, RunRequest(prompts=["Once upon a time"], mode="hybrid", seq_len=48), ".")
    return argv[1:]


def test_runner_start_and_exit_are_logged(phone):
    r = _sh(phone, "logcat -c; farm-llama-runner --help > /dev/null; echo rc=$?; logcat -d", timeout=120)
    assert "rc=1" in r.stdout  # gflags' --help exits 1
    runner = [e for e in _entries(r.stdout.split("\n", 1)[1]) if e[4] == "farm-llama-runner"]
    assert [e[5].split(":")[0] for e in runner] == ["start", "exit"], runner
    assert "--help" in runner[0][5] and runner[1][5] == "exit: status 1"
    assert runner[0][1] == runner[1][1]  # the same process, as the shell saw it


def test_crashed_runner_leaves_tombstone_and_crash_lines(phone, tiny_bundle, tmp_path):
    vf, dev = phone
    ws = "/data/local/tmp/crash-ws"
    args = _push_bundle(phone, tiny_bundle, ws, tmp_path)
    # The device's runner zygote up first (its first run starts it): the crashed run is then the
    # zygote's, with the wrapper as its client, as every run after a device's first is.
    _sh(phone, "farm-llama-runner --help > /dev/null 2>&1", timeout=120)
    deadline = time.monotonic() + 120
    while _sh(phone, f"test -S {RUNNER_ZYGOTE_SOCKET}").returncode != 0:
        assert time.monotonic() < deadline, "no runner zygote in the device after its first run"
        time.sleep(0.2)
    vf.set_faults(dev.serial, runner_delay_ms=500)  # a run of many seconds, to crash in the middle
    try:
        r = _sh(phone, f"logcat -c; cd {ws}; ./qnn_llama_runner {shlex.join(args)} > run.log 2>&1 & "
                       f"pid=$!; sleep 4; kill -SEGV $pid; wait $pid; echo rc=$? pid=$pid; "
                       f"ls /data/tombstones", timeout=300)
    finally:
        vf.clear_faults(dev.serial)
    rc_line, *tombstones = r.stdout.splitlines()
    rc, pid = (int(x.split("=")[1]) for x in rc_line.split())
    assert rc == 128 + 11, r.stdout + r.stderr  # the shell sees the runner die of SIGSEGV
    assert tombstones == ["tombstone_00"]
    text = _sh(phone, "cat /data/tombstones/tombstone_00").stdout.splitlines()
    assert text[0] == "*** *** *** *** *** *** *** *** *** *** *** *** *** *** *** ***"
    assert f"pid: {pid}, tid: {pid}, name: farm-llama-runn  >>> /system/bin/farm-llama-runner <<<" in text
    assert any(line.startswith("signal 11 (SIGSEGV), code 0 (SI_USER") for line in text)
    assert any(line.startswith("Cmdline: /system/bin/farm-llama-runner --model_path") for line in text)
    crash = _entries(_sh(phone, "logcat -d -b crash").stdout)
    assert all(e[1] == pid for e in crash)
    assert any(e[4] == "libc" and e[3] == "F" and e[5].startswith("Fatal signal 11 (SIGSEGV)")
               for e in crash)
    assert [e[5] for e in crash if e[4] == "DEBUG"] == text  # the tombstone's lines, in the crash buffer
    assert any(e[5] == "Tombstone written to: /data/tombstones/tombstone_00" for e in crash)
    main = [e for e in _entries(_sh(phone, "logcat -d -b main").stdout) if e[1] == pid]
    assert main[-1][3:] == ("E", "farm-llama-runner", "exit: killed by signal 11 (SIGSEGV)")
    # shell cannot forge or remove a tombstone
    assert _sh(phone, "rm -f /data/tombstones/tombstone_00").returncode != 0
