"""A failed test's evidence from its device: what a QNN engineer reads first when a run fails on a phone.

Two plain functions over a ``DeviceLike``: ``mark`` at the start of a test (the device's own clock, the
tombstones already there) and ``collect`` at its end, while the lease is still held (through the fenced
handle, so a holder that lost its device reads nothing of it):

- ``logcat.txt``: every buffer (``-b all``), ``-v threadtime``, the lines since the mark (``-t <epoch>``,
  the device's clock, so nothing is cleared for other readers), the last ``LOGCAT_BYTES``;
- ``tombstone_NN``: tombstones written or rewritten since the mark (tombstoned reuses names, so a
  changed mtime or size counts), the newest ``MAX_TOMBSTONES``, each bounded. Where ``/data/tombstones``
  cannot be read (user builds), ``crash.txt``: the crash buffer since the mark, which holds debuggerd's
  summary of the same crash;
- ``battery.txt``, ``thermal.txt``: ``dumpsys battery`` and ``dumpsys thermalservice`` now;
- ``runner-N.txt``: the runner invocations the test made (command line, exit code, stdout, stderr),
  given in by the caller (they are host-side already);
- ``capture-warnings.txt``: whatever could not be captured, and why.

Capture never raises (a failure of it is a warning in the evidence) and every command is bounded in
time and output: evidence must never turn a failure into an error, hide its message or fail the run.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from farm.device.protocol import DeviceLike
from farm.errors import AdbServerDown, DeviceGone, DeviceTimeout, LeaseLost

# After one of these, the device (or our hold of it) is gone for the rest of the capture: the later
# commands are skipped, so a hung phone costs one timeout, not one per command, inside the lease.
GIVE_UP = (DeviceGone, DeviceTimeout, LeaseLost, AdbServerDown)

TOMBSTONES = "/data/tombstones"
LOGCAT_BYTES = 1 << 20     # a busy phone writes MBs a minute: the lines nearest the failure are kept
TOMBSTONE_BYTES = 256 << 10  # a tombstone's head (signal, registers, backtrace) is what is read
MAX_TOMBSTONES = 4
DUMPSYS_BYTES = 64 << 10
RUNNER_BYTES = 256 << 10    # per stream of each runner invocation
MAX_RUNS = 8                # the last invocations of the test
TIMEOUT_S = 30.0            # per command: a device that stopped answering costs bounded time
TRUNCATED = b"[... earlier bytes cut: evidence keeps the last %d ...]\n"


class RunLike(Protocol):
    """What evidence keeps of a runner invocation (farm.execute.run.RunResult is one)."""

    command: str
    exit_code: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Mark:
    """The device at the start of a test: its clock (epoch seconds, as ``date +%s.%N`` printed it;
    None: not read) and its tombstones (name -> (mtime, size); None: not readable)."""

    since: str | None
    tombstones: dict[str, tuple[int, int]] | None
    warnings: tuple[str, ...] = ()


@dataclass
class Evidence:
    """Files by name (bytes, bounded) and what could not be captured."""

    files: dict[str, bytes] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def write(self, directory: Path) -> list[Path]:
        """Write every file (and the warnings, if any) into ``directory``; the paths written."""
        directory.mkdir(parents=True, exist_ok=True)
        files = dict(self.files)
        if self.warnings:
            files["capture-warnings.txt"] = "".join(f"{w}\n" for w in self.warnings).encode()
        written = []
        for name, data in files.items():
            path = directory / name
            path.write_bytes(data)
            written.append(path)
        return written


class _UntilItFails:
    """``device`` until a command fails as in ``GIVE_UP``; every later command then raises
    ``_Skipped`` without reaching the device."""

    def __init__(self, device: DeviceLike):
        self.device = device
        self.failure: str | None = None

    def shell(self, command: str, *, timeout: float):
        if self.failure is not None:
            raise _Skipped(f"skipped, the device failed an earlier command ({self.failure})")
        try:
            return self.device.shell(command, timeout=timeout)
        except GIVE_UP as e:
            self.failure = type(e).__name__
            raise


class _Skipped(Exception):
    pass


def _tail(data: bytes, limit: int) -> bytes:
    if len(data) <= limit:
        return data
    return TRUNCATED % limit + data[len(data) - limit:]


def _shell(device: DeviceLike, command: str, what: str, warnings: list[str], *,
           timeout: float) -> bytes | None:
    """stdout of ``command``, or None with a warning naming ``what`` and why. Never raises."""
    try:
        result = device.shell(command, timeout=timeout)
    except _Skipped as e:
        warnings.append(f"{what}: not captured: {e}")
        return None
    except Exception as e:  # noqa: BLE001 - evidence is best effort: a device gone, a lease lost, ...
        warnings.append(f"{what}: not captured: {type(e).__name__}: {e}")
        return None
    if result.exit_code != 0:
        why = (result.err or result.out).strip().splitlines()
        warnings.append(f"{what}: `{command}` exited {result.exit_code}"
                        + (f": {why[-1][:300]}" if why else ""))
        return None
    if result.stderr.strip():  # e.g. the left side of a pipe that failed: its output is incomplete
        warnings.append(f"{what}: `{command}` said: {result.err.strip().splitlines()[-1][:300]}")
    return result.stdout


_EPOCH = re.compile(r"^(\d{9,})(?:\.(\d+))?$")


def _since(text: str) -> str | None:
    """``date +%s.%N``'s output as logcat's ``-t`` takes it (seconds.millis); a toybox without %N
    prints a literal N: whole seconds then (the lines of that second before the start are kept too)."""
    text = text.strip()
    m = _EPOCH.match(text[:-2] if text.endswith(".N") else text)
    if m is None:
        return None
    return f"{m[1]}.{(m[2] or '0')[:3].ljust(3, '0')}"


_LIST_TOMBSTONES = (f"cd {shlex.quote(TOMBSTONES)} && for f in *; do "
                    "[ -f \"$f\" ] && stat -c '%Y %s %n' -- \"$f\"; done; true")


def _tombstones(device: DeviceLike, warnings: list[str], *,
                timeout: float) -> dict[str, tuple[int, int]] | None:
    out = _shell(device, _LIST_TOMBSTONES, f"tombstones ({TOMBSTONES})", warnings, timeout=timeout)
    if out is None:
        return None
    found: dict[str, tuple[int, int]] = {}
    for line in out.decode("utf-8", "replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            found[parts[2]] = (int(parts[0]), int(parts[1]))
    return found


def mark(device: DeviceLike, *, timeout: float = TIMEOUT_S) -> Mark:
    """The device's clock and tombstones now (at a test's start). Never raises."""
    warnings: list[str] = []
    device = _UntilItFails(device)  # type: ignore[assignment]
    clock = _shell(device, "date +%s.%N", "device clock", warnings, timeout=timeout)
    since = _since(clock.decode("utf-8", "replace")) if clock is not None else None
    if clock is not None and since is None:
        warnings.append(f"device clock: `date +%s.%N` printed {clock[:60]!r}, not epoch seconds")
    return Mark(since, _tombstones(device, warnings, timeout=timeout), tuple(warnings))


def logcat_command(since: str | None, *, buffers: str = "all", limit: int = LOGCAT_BYTES) -> str:
    """``logcat -d`` of ``buffers`` in threadtime since ``since`` (all it holds when None), its last
    ``limit`` bytes (cut on the device: the transfer is bounded too)."""
    args = ["logcat", "-d", "-b", buffers, "-v", "threadtime"]
    if since is not None:
        args += ["-t", since]
    return f"{shlex.join(args)} | tail -c {int(limit) + 1}"


def collect(device: DeviceLike, start: Mark, runs: Iterable[RunLike] = (), *,
            timeout: float = TIMEOUT_S) -> Evidence:
    """Everything the device says about the test since ``start``, and the test's runner invocations.
    Never raises: what could not be captured is a warning in the evidence."""
    ev = Evidence(warnings=list(start.warnings))
    device = _UntilItFails(device)  # type: ignore[assignment]
    if start.since is None:
        ev.warnings.append("logcat: the device's clock at the test's start is unknown: all it holds")
    logcat = _shell(device, logcat_command(start.since), "logcat", ev.warnings, timeout=timeout)
    if logcat is not None:
        ev.files["logcat.txt"] = _tail(logcat, LOGCAT_BYTES)
    now = _tombstones(device, ev.warnings, timeout=timeout) if start.tombstones is not None else None
    if now is None:
        # A user build: shell cannot list /data/tombstones; debuggerd's summary is in the crash buffer.
        ev.warnings.append(f"tombstones: {TOMBSTONES} not readable; the crash buffer instead")
        crash = _shell(device, logcat_command(start.since, buffers="crash", limit=TOMBSTONE_BYTES),
                       "logcat -b crash", ev.warnings, timeout=timeout)
        if crash is not None:
            ev.files["crash.txt"] = _tail(crash, TOMBSTONE_BYTES)
    else:
        assert start.tombstones is not None
        new = [name for name, stamp in now.items() if start.tombstones.get(name) != stamp]
        new.sort(key=lambda name: now[name][0], reverse=True)
        if len(new) > MAX_TOMBSTONES:
            ev.warnings.append(f"tombstones: {len(new)} new, the newest {MAX_TOMBSTONES} kept")
        for name in new[:MAX_TOMBSTONES]:
            path = f"{TOMBSTONES}/{name}"
            data = _shell(device, f"head -c {TOMBSTONE_BYTES + 1} -- {shlex.quote(path)}",
                          f"tombstone {path}", ev.warnings, timeout=timeout)
            if data is not None:
                ev.files[_file_name(name)] = _head(data, TOMBSTONE_BYTES)
    for name, command in (("battery.txt", "dumpsys battery"),
                          ("thermal.txt", "dumpsys thermalservice")):
        data = _shell(device, f"{command} | head -c {DUMPSYS_BYTES + 1}", command, ev.warnings,
                      timeout=timeout)
        if data is not None:
            ev.files[name] = _head(data, DUMPSYS_BYTES)
    runs = list(runs)
    if len(runs) > MAX_RUNS:
        ev.warnings.append(f"runner: {len(runs)} invocations, the last {MAX_RUNS} kept")
    first = max(0, len(runs) - MAX_RUNS)
    for i, run in enumerate(runs[first:], first + 1):
        ev.files[f"runner-{i}.txt"] = runner_text(run)
    return ev


def runner_text(run: RunLike) -> bytes:
    """One invocation as a person reads it: the command line, its exit code, stdout and stderr."""
    def stream(text: str) -> str:
        return _tail((text or "").encode("utf-8", "replace"), RUNNER_BYTES).decode("utf-8", "replace")

    return (f"$ {run.command}\nexit code: {run.exit_code}\n"
            f"--- stdout ---\n{stream(run.stdout)}\n--- stderr ---\n{stream(run.stderr)}\n").encode()


def _head(data: bytes, limit: int) -> bytes:
    if len(data) <= limit:
        return data
    return data[:limit] + b"\n[... cut at %d bytes: evidence is bounded ...]\n" % limit


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).lstrip(".") or "tombstone"


def safe_dir_name(nodeid: str, limit: int = 120) -> str:
    """A test id as one directory name (``tests/x.py::test_a[SM8650]`` -> ``tests_x.py_test_a_SM8650``);
    a long id keeps its end behind a digest of the whole, so two long ids never share one."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("._") or "test"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(nodeid.encode()).hexdigest()[:10]
    return f"{digest}-{name[-(limit - 11):]}"
