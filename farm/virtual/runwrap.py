"""What a virtual device's ``/system/bin/farm-llama-runner`` runs: the runner, watched as a phone's system
watches a native process. It logs the run's start and exit to the device's logcat (main buffer, the
runner's name as tag) and, when the runner dies of a signal debuggerd reports (SIGSEGV, SIGABRT, ...),
has the device's logd write the crash's lines into the crash buffer and a tombstone
(farm/virtual/logd.py).

    python -S -m farm.virtual.runwrap REAL_RUNNER NAME [ARGS...]

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
import subprocess
import sys
import time

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: python -S -m farm.virtual.runwrap REAL_RUNNER NAME [ARGS...]", file=sys.stderr)
        return 2
    real, name, args = argv[0], argv[1], argv[2:]
    shown = [name, *args]
    tag = os.path.basename(name)
    started = time.time()
    _log(tag, 4, f"start: pid {os.getpid()}: {shlex.join(shown)}")
    try:
        child = subprocess.Popen([real, *args], preexec_fn=_die_with_parent)  # noqa: PLW1509
    except OSError as e:
        print(f"{name}: {e}", file=sys.stderr)
        _log(tag, 6, f"exit: could not start: {e}")
        return 127

    def forward(signum: int, _frame) -> None:
        try:
            child.send_signal(signum)
        except OSError:
            pass  # already gone

    for sig in FORWARDED:
        signal.signal(sig, forward)
    code = child.wait()
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
