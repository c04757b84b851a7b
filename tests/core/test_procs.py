"""The process supervisor: TERM then KILL, never a foreign pid, the owner watchdog."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import psutil
import pytest

from farm import procs

# A helper that says when its signal handling is in place, then sleeps.
SLEEPER = ("import signal, sys, time\n"
           "if sys.argv[1] == 'ignore-term': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
           "print('ready', flush=True)\n"
           "time.sleep(120)\n")


def _sleeper(tmp_path, mode: str, tag: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, mode, tag], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def reap():
    started: list[subprocess.Popen] = []
    yield started.append
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        if p.stdout:
            p.stdout.close()


@pytest.mark.parametrize("mode, grace, ended_by", [
    ("plain", 10.0, signal.SIGTERM),        # TERM is enough for a well-behaved process
    ("ignore-term", 0.3, signal.SIGKILL),   # one that ignores TERM is KILLed after the grace
    ("plain", 0.0, signal.SIGKILL),         # grace 0: KILL at once
])
def test_terminate_sends_term_then_kill(tmp_path, reap, mode, grace, ended_by):
    tag = f"helper-{mode}-{grace}"
    proc = _sleeper(tmp_path, mode, tag)
    reap(proc)
    assert procs.terminate(proc.pid, procs.cmdline_has([tag]), grace=grace, timeout=10, proc=proc)
    assert proc.returncode == -ended_by


def test_a_foreign_pid_is_never_signalled(tmp_path, reap):
    """A pid file whose pid now belongs to another process (a reused pid): left alone."""
    foreign = _sleeper(tmp_path, "plain", "someone-else")
    reap(foreign)
    pid_file = tmp_path / "helper.pid"
    procs.write_pid_file(pid_file, foreign.pid)
    owned = procs.cmdline_has(["farm.virtual.device"], ["--root", str(tmp_path)])
    pid = procs.read_pid_file(pid_file)
    assert pid == foreign.pid and not procs.is_ours(pid, owned)
    assert procs.terminate(pid, owned, grace=0.1, timeout=0.1)  # "not ours": nothing to end
    assert foreign.poll() is None and psutil.Process(foreign.pid).is_running()
    assert procs.wait_gone(pid, owned, timeout=0)  # gone as far as we are concerned


def test_ownership_needs_every_run_side_by_side():
    owned = procs.cmdline_has(["adb"], ["-P", "15037", "server", "nodaemon"])
    assert owned(["adb", "-a", "-P", "15037", "server", "nodaemon"])
    assert not owned(["adb", "-P", "15038", "server", "nodaemon"])
    assert not owned(["adb", "-P", "server", "15037", "nodaemon"])
    assert not owned(["python", "-P", "15037", "server", "nodaemon"])
    assert not procs.is_ours(None, owned) and not procs.is_ours(-1, owned)


def test_pid_files(tmp_path):
    assert procs.read_pid_file(tmp_path / "missing.pid") is None
    (tmp_path / "bad.pid").write_text("not a pid\n")
    assert procs.read_pid_file(tmp_path / "bad.pid") is None
    procs.write_pid_file(tmp_path / "good.pid", 4242)
    assert procs.read_pid_file(tmp_path / "good.pid") == 4242


def test_wait_until_has_a_deadline():
    calls = []
    assert not procs.wait_until(lambda: calls.append(1) and False, timeout=0.2, interval=0.01)
    assert len(calls) >= 2
    assert procs.wait_until(lambda: True, timeout=0)


def test_a_zombie_owner_is_gone(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    alive = procs.owner_alive(owner.pid)
    assert procs.wait_until(lambda: not alive(), timeout=10)  # exited, not reaped yet
    assert psutil.Process(owner.pid).status() == psutil.STATUS_ZOMBIE
    owner.wait()


def test_watchdog_ends_the_child_when_the_owner_dies(tmp_path, reap):
    owner = _sleeper(tmp_path, "plain", "owner")
    reap(owner)
    argv = procs.tied_argv(owner.pid, [sys.executable, "-c", SLEEPER, "ignore-term", "tied-child"])
    watchdog = procs.spawn(argv, log_path=tmp_path / "tied.log", env=procs.farm_env())
    reap(watchdog)
    owned = procs.cmdline_has(["tied-child"])

    def child() -> int | None:
        kids = [p for p in psutil.Process(watchdog.pid).children() if procs.is_ours(p.pid, owned)]
        return kids[0].pid if kids else None

    assert procs.wait_until(lambda: child() is not None and "ready" in procs.log_tail(
        tmp_path / "tied.log"), timeout=20), procs.log_tail(tmp_path / "tied.log")
    child_pid = child()
    assert watchdog.poll() is None
    owner.kill()
    owner.wait()
    # The child ignores TERM: the watchdog must KILL it (5 s grace) and then exit itself.
    assert procs.wait_until(lambda: not procs.is_ours(child_pid, owned), timeout=30), \
        "the tied child outlived its owner"
    assert watchdog.wait(timeout=30) == 0, procs.log_tail(tmp_path / "tied.log")
    assert "owner pid" in (tmp_path / "tied.log").read_text()


def test_watchdog_passes_on_the_child_exit_code(tmp_path, reap):
    owner = _sleeper(tmp_path, "plain", "owner2")
    reap(owner)
    argv = procs.tied_argv(owner.pid, [sys.executable, "-c", "raise SystemExit(7)"])
    watchdog = procs.spawn(argv, log_path=tmp_path / "tied.log", env=procs.farm_env())
    reap(watchdog)
    assert watchdog.wait(timeout=30) == 7
    assert owner.poll() is None


def test_in_process_watch_calls_back_once_the_owner_is_gone(tmp_path, reap):
    owner = _sleeper(tmp_path, "plain", "owner3")
    reap(owner)
    gone = threading.Event()
    thread = procs.watch_owner(owner.pid, gone.set, interval=0.02)
    assert not gone.wait(0.2)
    owner.kill()  # not reaped: a zombie owner counts as gone
    assert gone.wait(10), "watch_owner did not notice the owner's death"
    thread.join(5)
    assert not thread.is_alive()


def test_kill_group_of_nothing_is_false():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    assert procs.kill_group(proc.pid) is False



# Re-executes itself N times (as a virtual device's reboot does), then sleeps a moment.
EXEC_LOOP = ("import os, sys, time\n"
             "n = int(sys.argv[1])\n"
             "if n > 0:\n"
             "    os.execv(sys.executable, [sys.executable, __file__, str(n - 1), sys.argv[2]])\n"
             "time.sleep(0.2)\n")


def test_a_process_in_the_middle_of_an_execve_is_still_ours(tmp_path, reap):
    """Between the old image and the new one the kernel shows an empty command line; polling
    ownership through a chain of execs must never see the process as gone while it runs."""
    script = tmp_path / "exec_loop.py"
    script.write_text(EXEC_LOOP)
    proc = subprocess.Popen([sys.executable, str(script), "100", "exec-loop-tag"])
    reap(proc)
    owned = procs.cmdline_has(["exec-loop-tag"])
    checks = wrong = 0
    while proc.poll() is None:
        checks += 1
        if not procs.is_ours(proc.pid, owned) and proc.poll() is None:
            wrong += 1
    assert proc.returncode == 0
    assert checks > 100 and wrong == 0


def test_a_kernel_threads_empty_command_line_is_not_waited_on(monkeypatch):
    """Only a process between two images is re-read: a scan of /proc meets dozens of kernel threads,
    whose command line is empty for good (waiting on each made killing a server take 30 s)."""
    kthreads = [pid for pid in psutil.pids() if procs._kernel_thread(pid)]
    if not kthreads:
        pytest.skip("no kernel thread visible in this pid namespace")

    def no_wait(seconds):
        raise AssertionError(f"waited {seconds} s on a kernel thread's command line")

    monkeypatch.setattr(procs.time, "sleep", no_wait)
    assert [procs.cmdline(pid) for pid in kthreads[:20]] == [None] * min(20, len(kthreads))
