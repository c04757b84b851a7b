"""Helper processes the farm starts and must end again: the adb server and virtual devices.

    owned = procs.cmdline_has(["farm.virtual.device", "--root", str(root)])
    proc = procs.spawn(procs.module_argv("farm.virtual.device", "--root", str(root)),
                       log_path=root / "device.log", cwd=root)
    procs.write_pid_file(root / "device.pid", proc.pid)
    procs.wait_until(lambda: (root / "run.json").exists(), timeout=30)
    procs.terminate(procs.read_pid_file(root / "device.pid"), owned)   # TERM, wait, then KILL

Ownership: a pid read back from a file may belong to another process by now (pids are reused), so a
signal only goes to a process whose command line still shows what we started; psutil also refuses
to signal a pid that was reused between that check and the signal.

A helper tied to its owner ends when the owner is gone (a test session killed -9 leaves nothing behind):
in-process with :func:`watch_owner`, or around any command with :func:`tied_argv`, which runs it
under ``python -m farm.procs --exit-with-pid PID -- COMMAND...``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

Owned = Callable[[list[str]], bool]  # does this command line belong to what we started?
REPO_ROOT = Path(__file__).resolve().parents[1]  # so `python -m farm....` imports this checkout


# --- starting -------------------------------------------------------------------------------------

def module_argv(module: str, *args: str) -> list[str]:
    """``python -m module args...`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def farm_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: ours) with this checkout first on PYTHONPATH, for ``python -m farm....``."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def spawn(argv: Sequence[str], *, log_path: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen:
    """Start ``argv`` detached: its own session (no terminal signals), stdin from /dev/null, stdout and
    stderr appended to ``log_path``. Raises OSError when it cannot be run."""
    with open(log_path, "ab") as out:
        return subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)


def log_tail(path: Path, lines: int = 5) -> str:
    """The last lines of a helper's log on one line, for an error message."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


# --- pid files ------------------------------------------------------------------------------------

def write_pid_file(path: Path, pid: int) -> None:
    path.write_text(str(pid))


def read_pid_file(path: Path) -> int | None:
    """The pid in ``path``; None when the file is missing or not a pid."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# --- ownership ------------------------------------------------------------------------------------

EXEC_SETTLE_S = 0.5  # how long an empty command line may last before it is believed


def cmdline(pid: int) -> list[str] | None:
    """The command line of a running process; None when there is none (gone, a zombie, not ours to
    read). A process in the middle of an execve reads as an empty command line for a moment (a
    virtual device re-executes itself to reboot): that is re-read, not taken for a gone process,
    which on a loaded host turned a reboot into 'did not come back'."""
    deadline = time.monotonic() + EXEC_SETTLE_S
    while True:
        try:
            args = psutil.Process(pid).cmdline()
        except (psutil.Error, ValueError):  # NoSuchProcess, ZombieProcess, AccessDenied; pid < 0
            return None
        if args or _kernel_thread(pid) or time.monotonic() >= deadline:
            return args or None  # a kernel thread's is always empty: asked at once, never waited on
        time.sleep(0.002)


_PF_KTHREAD = 0x00200000  # include/linux/sched.h


def _kernel_thread(pid: int) -> bool:
    """Whether ``pid`` is a kernel thread (the flags field of /proc/PID/stat), whose command line is
    empty for good; a process between two images also reads empty, for a moment."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return bool(int(stat.rpartition(b")")[2].split()[6]) & _PF_KTHREAD)
    except (OSError, ValueError, IndexError):
        return False


def cmdline_has(*runs: Sequence[str]) -> Owned:
    """Ownership by command line: each run of arguments appears in it, in order, side by side."""
    wanted = [tuple(str(a) for a in run) for run in runs]

    def owned(args: list[str]) -> bool:
        return all(any(tuple(args[i:i + len(run)]) == run for i in range(len(args) - len(run) + 1))
                   for run in wanted)

    return owned


def is_ours(pid: int | None, owned: Owned) -> bool:
    """True when ``pid`` runs and its command line is one we started."""
    if pid is None or pid <= 0:
        return False
    args = cmdline(pid)
    return args is not None and owned(args)


def _any(_args: list[str]) -> bool:
    return True


# --- waiting and ending ---------------------------------------------------------------------------

def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true (True) or ``timeout`` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def wait_gone(pid: int, owned: Owned, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    """Wait until the process is no longer ours: exited, or reaped when ``proc`` is our child (whose
    pid nobody else can have before that)."""
    def gone() -> bool:
        if proc is not None and proc.pid == pid:
            return proc.poll() is not None  # poll() reaps
        return not is_ours(pid, owned)

    return wait_until(gone, timeout, interval=0.02)


def terminate(pid: int | None, owned: Owned, *, grace: float = 3.0, timeout: float = 3.0,
              proc: subprocess.Popen | None = None) -> bool:
    """End a process we started: SIGTERM, up to ``grace`` s to exit, then SIGKILL and up to ``timeout``
    s more (``grace=0``: SIGKILL at once). A pid that is not ours (any more) is never signalled.
    Give ``proc`` when it is our child, so that it is reaped. True when the process is gone."""
    if pid is None:
        return True
    steps = ((signal.SIGTERM, grace),) if grace > 0 else ()
    for sig, wait in (*steps, (signal.SIGKILL, timeout)):
        if wait_gone(pid, owned, 0, proc):
            return True
        try:
            process = psutil.Process(pid)
            if not owned(process.cmdline()):
                return True
            process.send_signal(sig)  # refuses a pid reused since Process(pid)
        except (psutil.NoSuchProcess, ProcessLookupError):
            return True
        except psutil.AccessDenied as e:
            log.warning("cannot signal pid %d (%s): not ours to end", pid, e)
            return False
        if wait_gone(pid, owned, wait, proc):
            return True
    log.warning("pid %d still runs %.0f s after SIGKILL", pid, timeout)
    return False


def stop_child(proc: subprocess.Popen, grace: float = 3.0, timeout: float = 3.0) -> bool:
    """:func:`terminate` for our own child: its pid cannot be reused before we reap it."""
    return terminate(proc.pid, _any, grace=grace, timeout=timeout, proc=proc)


def kill_group(pgid: int) -> bool:
    """SIGKILL a process group; False when there was none (already gone) or it is not ours."""
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    except PermissionError as e:
        log.warning("process group %d is not ours to kill: %s", pgid, e)
        return False


# --- tied to an owner -----------------------------------------------------------------------------

def owner_alive(pid: int) -> Callable[[], bool]:
    """A check that the process ``pid`` is still the one running now: not gone, not a zombie, and not
    a new process that reuses its pid."""
    try:
        process = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return lambda: False

    def alive() -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True  # it exists; we may not look at it

    return alive


def watch_owner(owner: int, on_gone: Callable[[], None], interval: float = 0.5) -> threading.Thread:
    """A daemon thread that calls ``on_gone`` once the owner process is gone."""
    alive = owner_alive(owner)

    def watch() -> None:
        while alive():
            time.sleep(interval)
        log.warning("owner pid %d is gone: ending", owner)
        on_gone()

    thread = threading.Thread(target=watch, name=f"watch-owner-{owner}", daemon=True)
    thread.start()
    return thread


def tied_argv(owner: int, argv: Sequence[str]) -> list[str]:
    """``argv`` run under a watchdog that ends it when ``owner`` is gone (start it with
    :func:`farm_env`). The watchdog's own command line still contains ``argv``."""
    return module_argv(__name__, "--exit-with-pid", str(owner), "--", *argv)


def run_tied(owner: int, argv: Sequence[str], interval: float = 0.5) -> int:
    """Run ``argv`` until it exits (its exit code) or ``owner`` is gone (TERM, then KILL; 0). SIGTERM
    to the watchdog is passed on."""
    alive = owner_alive(owner)
    child = subprocess.Popen(list(argv))
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    while True:
        try:
            return child.wait(timeout=interval)
        except subprocess.TimeoutExpired:
            if not alive():
                log.warning("owner pid %d is gone: ending %s", owner, argv[0])
                stop_child(child, grace=5.0)
                return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m farm.procs",
                                     description="Run a command until it exits or a process is gone.")
    parser.add_argument("--exit-with-pid", type=int, required=True, help="the owner process")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    return run_tied(args.exit_with_pid, args.command)


if __name__ == "__main__":
    sys.exit(main())
