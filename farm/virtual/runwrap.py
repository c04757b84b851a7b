"""What a virtual device's ``/system/bin/farm-llama-runner`` runs: the runner, watched as a phone's system
watches a native process. It logs the run's start and exit to the device's logcat (main buffer, the
runner's name as tag) and, when the runner dies of a signal debuggerd reports (SIGSEGV, SIGABRT, ...),
has the device's logd write the crash's lines into the crash buffer and a tombstone
(farm/virtual/logd.py).

    python -S -m farm.virtual.runwrap [--zygote] REAL_RUNNER NAME [ARGS...]

With ``--zygote`` (REAL_RUNNER is farm-llama-runner) and a runner zygote named by the environment, this
process is the zygote's client itself (farm/runner/zygote.py's run_remote): the run is forked there with
this process's stdio, cwd and environment, and no second Python starts for the client (one per run:
about 35 ms of CPU). When the zygote does not take the run, REAL_RUNNER runs as without ``--zygote`` (it
starts the device's first zygote, or runs in-process).

It keeps the runner's observable behaviour: the same pid for whoever started it (the shell ``exec``s
this), stdin/stdout/stderr inherited, signals it receives passed on to the runner, and its end: the same
exit code, or death by the same signal (so the shell reports 128+N). If this process is SIGKILLed (the
farm's run timeout), the kernel kills the runner too (PR_SET_PDEATHSIG), which ends a zygote run as
before. A runner that exits 128+N for a crash signal N is a crash too: that is how the runner zygote's
client reports a child that died of N (farm/runner/zygote.py). Logging is best effort: a device whose
logd is gone still runs its runner unchanged. Standard library only, ``-S``.
"""

from __future__ import annotations

import os
import resource
import shlex
import signal
import sys
import time

from farm.runner import zygote
from farm.virtual.logcat import logd_request
from farm.virtual.logwire import CRASH_SIGNALS

PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, *(signal.Signals(n) for n in CRASH_SIGNALS))


def _die_with_parent() -> None:
    """In the runner, before exec: SIGKILL when this wrapper dies."""
    import ctypes  # only in the child: ctypes costs the wrapper's start-up otherwise

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the wrapper died before prctl took effect
        os._exit(137)


def _send(request: dict) -> dict | None:
    try:
        answers = list(logd_request(request))
    except Exception:  # noqa: BLE001 - logging must never change the run
        return None
    return answers[0] if answers else None


def _log(tag: str, prio: int, msg: str, buffer: str = "main") -> None:
    _send({"op": "write", "buffer": buffer, "prio": prio, "tag": tag, "msg": msg, "pid": os.getpid(),
           "tid": os.getpid()})


class _Signalled(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _through_zygote(socket_path: str, args: list[str]) -> int | None:
    """The run's exit code, run by the zygote with this process as its client; None when the zygote
    did not take it (nothing ran). What the client process did is kept: SIGINT, SIGTERM and SIGHUP
    are passed on to the run (run_remote relays them); any other signal this wrapper forwards would
    have killed that client, and so the run (the zygote kills a run whose client is gone): here it
    ends the wait, which closes the connection, and reads as the same death (-N)."""
    def killed(signum: int, _frame) -> None:
        raise _Signalled(signum)

    # A signal the caller ignores (a shell's background job ignores SIGQUIT) was ignored by the client
    # too: it stays ignored.
    previous = {sig: signal.signal(sig, killed) for sig in FORWARDED
                if sig not in zygote.FORWARDED and signal.getsignal(sig) != signal.SIG_IGN}
    try:
        return zygote.run_remote(socket_path, args)
    except zygote.NotAnswering:
        return None
    except _Signalled as e:
        return -e.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_child(real: str, name: str, tag: str, args: list[str]) -> int | None:
    """REAL_RUNNER's exit code (-N: killed by signal N), as a child of this process; None when it
    could not start (said on stderr and in the log)."""
    import subprocess  # here: the zygote takes most runs, and this import is ~3 ms of every start

    try:
        child = subprocess.Popen([real, *args], preexec_fn=_die_with_parent)  # noqa: PLW1509
    except OSError as e:
        print(f"{name}: {e}", file=sys.stderr)
        _log(tag, 6, f"exit: could not start: {e}")
        return None

    def forward(signum: int, _frame) -> None:
        try:
            child.send_signal(signum)
        except OSError:
            pass  # already gone

    for sig in FORWARDED:
        signal.signal(sig, forward)
    return child.wait()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    via_zygote = bool(argv) and argv[0] == "--zygote"
    argv = argv[1:] if via_zygote else argv
    if len(argv) < 2:
        print("usage: python -S -m farm.virtual.runwrap [--zygote] REAL_RUNNER NAME [ARGS...]",
              file=sys.stderr)
        return 2
    real, name, args = argv[0], argv[1], argv[2:]
    shown = [name, *args]
    tag = os.path.basename(name)
    started = time.time()
    _log(tag, 4, f"start: pid {os.getpid()}: {shlex.join(shown)}")
    code = None
    if via_zygote and (socket_path := os.environ.get(zygote.ZYGOTE_ENV)):
        code = _through_zygote(socket_path, args)
    if code is None:
        code = _run_child(real, name, tag, args)
        if code is None:
            return 127
    signo = -code if code < 0 else (code - 128 if code - 128 in CRASH_SIGNALS else 0)
    if code < 0:
        _log(tag, 6, f"exit: killed by signal {signo} ({signal.Signals(signo).name})")
    else:
        _log(tag, 4 if code == 0 else 6, f"exit: status {code}")
    if signo in CRASH_SIGNALS:
        _send({"op": "crash", "pid": os.getpid(), "signal": signo, "argv": shown, "started": started})
    if code >= 0:
        return code
    # Die of the same signal, as the runner did (no core file: a phone writes a tombstone instead).
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.stdout.flush()
    os.kill(os.getpid(), -code)
    return 128 - code  # a signal that does not kill (SIGCHLD-like): the shell's code for it


if __name__ == "__main__":
    sys.exit(main())
