"""The log daemon of a virtual device: Android's ring buffers (main, system, crash) in the device
process, and its tombstones.

The device process (on the host, trusted) keeps the buffers in memory, each bounded in bytes as logd
bounds them (256 KiB by default), so a reboot (the process re-executes) clears them as a phone's
reboot does. Commands inside the device reach it through a Unix socket, ``/dev/socket/logd`` in the
device's view (``R/run/socket/logd`` on the host, bound read-only): ``log`` writes to it, ``logcat``
reads and clears (farm/virtual/logcat.py), and the runner's wrapper (farm/virtual/runwrap.py) reports
its runs and crashes there. A crash becomes what debuggerd makes of one: the tombstone-style lines in
the crash buffer (tag ``DEBUG``) and ``/data/tombstones/tombstone_NN`` (``R/tombstones`` on the host,
bound read-only over the device's ``/data/tombstones``: shell can read it, as on a userdebug build, but
not forge or delete it).

Protocol: one JSON request line per connection; the answer is JSON lines, then EOF (a ``follow``
read stays open and streams new entries until the client goes away).

    {"op": "write", "buffer": "main", "prio": 4, "tag": "T", "msg": "...", "pid": N, "tid": N}
    {"op": "read", "buffers": ["main", ...], "tail": N|null, "since": epoch|null, "follow": bool}
    {"op": "clear", "buffers": [...]}          {"op": "size", "buffers": [...]}
    {"op": "crash", "pid": N, "signal": N, "argv": [...], "started": epoch, "sender": N}

Unix socket paths are limited to 107 bytes; a device root can be deeper than that, so both ends go
through ``/proc/self/fd/N/<name>`` of an open directory (:func:`short_path`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

from farm.fileio import write_atomic
from farm.virtual.logwire import (
    BUFFERS,
    CRASH_SIGNALS,
    DEFAULT_BUFFERS,
    PRIORITIES,
    SOCKET_NAME,
    SOCKET_REL,
    TOMBSTONES_REL,
    short_path,
)

log = logging.getLogger(__name__)

BUFFER_BYTES = 256 * 1024                       # logd's default size per buffer
MAX_PAYLOAD = 4068                              # logd's largest message; longer ones are cut
ENTRY_OVERHEAD = 28                             # bytes an entry costs beyond tag and message (logger_entry)
MAX_TOMBSTONES = 32                             # tombstoned's ro.tombstoned.max_tombstone_count


@dataclass(frozen=True)
class LogEntry:
    seq: int        # arrival order across buffers (logd merges buffers by time; arrival is that)
    buffer: str
    time: float     # epoch seconds (CLOCK_REALTIME, as logd stamps entries)
    pid: int
    tid: int
    prio: int
    tag: str
    msg: str

    @property
    def size(self) -> int:
        return ENTRY_OVERHEAD + len(self.tag.encode()) + len(self.msg.encode())


class LogBuffers:
    """The ring buffers: each drops its oldest entries past ``limit`` bytes."""

    def __init__(self, limit: int = BUFFER_BYTES):
        self.limit = limit
        self._entries: dict[str, deque[LogEntry]] = {b: deque() for b in BUFFERS}
        self._bytes = dict.fromkeys(BUFFERS, 0)
        self._seq = 0
        self._changed = threading.Condition()

    def write(self, buffer: str, prio: int, tag: str, msg: str, pid: int = 0, tid: int | None = None,
              when: float | None = None) -> None:
        if buffer not in self._entries:
            raise ValueError(f"unknown log buffer {buffer!r} (known: {', '.join(BUFFERS)})")
        msg = msg.encode()[:MAX_PAYLOAD].decode(errors="ignore")
        with self._changed:
            self._seq += 1
            entry = LogEntry(self._seq, buffer, time.time() if when is None else when, pid,
                             pid if tid is None else tid, min(max(prio, 2), 8), tag, msg)
            ring = self._entries[buffer]
            ring.append(entry)
            self._bytes[buffer] += entry.size
            while self._bytes[buffer] > self.limit and len(ring) > 1:
                self._bytes[buffer] -= ring.popleft().size
            self._changed.notify_all()

    def clear(self, buffers: list[str]) -> None:
        with self._changed:
            for b in buffers:
                self._entries[b].clear()
                self._bytes[b] = 0

    def sizes(self, buffers: list[str]) -> dict[str, int]:
        with self._changed:
            return {b: self._bytes[b] for b in buffers}

    def snapshot(self, buffers: list[str], after_seq: int = 0) -> list[LogEntry]:
        with self._changed:
            found = [e for b in buffers for e in self._entries[b] if e.seq > after_seq]
        return sorted(found, key=lambda e: e.seq)

    def wait_past(self, seq: int, timeout: float) -> None:
        with self._changed:
            if self._seq <= seq:
                self._changed.wait(timeout)


class LogDaemon:
    """The device's logd: the buffers, their socket server and the tombstones."""

    def __init__(self, root: Path, props: dict[str, str], limit: int = BUFFER_BYTES):
        self.root = root
        self.props = props
        self.buffers = LogBuffers(limit)
        self.socket_dir = root / SOCKET_REL
        self.tombstones = root / TOMBSTONES_REL
        self._sock: socket.socket | None = None
        self._stopping = threading.Event()
        self._tombstone_lock = threading.Lock()

    # --- what the device itself logs -------------------------------------------------------------
    def write(self, buffer: str, prio: str, tag: str, msg: str, pid: int = 0) -> None:
        """One entry per line of ``msg``, as liblog splits nothing but logcat prints per line."""
        self.buffers.write(buffer, PRIORITIES.index(prio), tag, msg, pid)

    def start(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self.tombstones.mkdir(parents=True, exist_ok=True)
        fd, short = short_path(self.socket_dir, SOCKET_NAME)
        try:
            try:
                os.unlink(short)
            except FileNotFoundError:
                pass
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(short)
            os.chmod(short, 0o666)  # logd's sockets are world-writable; the view makes it shell's
            sock.listen(32)
        finally:
            os.close(fd)
        self._sock = sock
        threading.Thread(target=self._serve, name="logd", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            try:
                line = f.readline(1 << 20)
                request = json.loads(line)
                if not isinstance(request, dict):
                    raise ValueError("not an object")
                self._answer(request, f)
            except (ValueError, KeyError, TypeError) as e:
                self._send(f, {"error": f"bad request: {e}"})
            except OSError as e:  # the client went away (a follow read killed)
                log.debug("logd client gone: %s", e)

    def _send(self, f, obj: dict) -> None:
        f.write(json.dumps(obj).encode() + b"\n")
        f.flush()

    def _buffers(self, request: dict) -> list[str]:
        names = request.get("buffers") or list(DEFAULT_BUFFERS)
        unknown = [b for b in names if b not in BUFFERS]
        if unknown:
            raise ValueError(f"unknown buffer(s) {unknown}")
        return list(names)

    def _answer(self, request: dict, f) -> None:
        op = request.get("op")
        if op == "write":
            self.buffers.write(request.get("buffer", "main"), int(request.get("prio", 4)),
                               str(request.get("tag", "")), str(request.get("msg", "")),
                               int(request.get("pid", 0)), int(request.get("tid", 0)) or None)
            self._send(f, {"ok": True})
        elif op == "clear":
            self.buffers.clear(self._buffers(request))
            self._send(f, {"ok": True})
        elif op == "size":
            self._send(f, {"sizes": self.buffers.sizes(self._buffers(request)), "limit": self.buffers.limit})
        elif op == "read":
            self._read(request, f)
        elif op == "crash":
            path = self.crash(int(request["pid"]), int(request["signal"]),
                              [str(a) for a in request.get("argv", [])],
                              started=float(request.get("started", time.time())),
                              sender=request.get("sender"))
            self._send(f, {"tombstone": path})
        else:
            raise ValueError(f"unknown op {op!r}")

    def _read(self, request: dict, f) -> None:
        buffers = self._buffers(request)
        entries = self.buffers.snapshot(buffers)
        last = entries[-1].seq if entries else 0
        since = request.get("since")
        if since is not None:
            entries = [e for e in entries if e.time >= float(since)]
        tail = request.get("tail")
        if tail is not None:
            entries = entries[-int(tail):] if int(tail) > 0 else []
        for e in entries:
            self._send(f, asdict(e))
        if not request.get("follow"):
            return
        while not self._stopping.is_set():
            self.buffers.wait_past(last, timeout=1.0)
            for e in self.buffers.snapshot(buffers, after_seq=last):
                self._send(f, asdict(e))
                last = e.seq

    # --- crashes ---------------------------------------------------------------------------------
    def crash(self, pid: int, signo: int, argv: list[str], *, started: float,
              sender: int | None = None) -> str:
        """What debuggerd does for a process killed by ``signo``: the crash buffer's lines and a
        tombstone. Returns the tombstone's path inside the device."""
        name = CRASH_SIGNALS.get(signo, f"signal {signo}")
        comm = os.path.basename(argv[0])[:15] if argv else "<unknown>"
        now = time.time()
        code = (f"code 0 (SI_USER from pid {sender}, uid 2000)" if sender
                else "code 0 (SI_USER)")
        head = [
            "*** *** *** *** *** *** *** *** *** *** *** *** *** *** *** ***",
            f"Build fingerprint: '{self.props.get('ro.build.fingerprint', '')}'",
            "Revision: '0'",
            "ABI: 'arm64'",
            f"Timestamp: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))}."
            f"{int(now % 1 * 1e9):09d}{time.strftime('%z', time.localtime(now))}",
            f"Process uptime: {max(0, int(now - started))}s",
            f"Cmdline: {' '.join(argv)}",
            f"pid: {pid}, tid: {pid}, name: {comm}  >>> {argv[0] if argv else comm} <<<",
            "uid: 2000",
            f"signal {signo} ({name}), {code}, fault addr --------",
        ]
        # libc's line first (bionic logs it before crash_dump runs), then crash_dump's.
        self.buffers.write("crash", 7, "libc", f"Fatal signal {signo} ({name}), {code} in tid {pid} "
                                               f"({comm}), pid {pid} ({comm})", pid)
        for line in head:
            self.buffers.write("crash", 7, "DEBUG", line, pid)
        with self._tombstone_lock:
            path = self._next_tombstone()
            self.buffers.write("crash", 6, "tombstoned",
                               f"Tombstone written to: /data/tombstones/{path.name}", pid)
            write_atomic(path, "\n".join(head) + "\n")
        return f"/data/tombstones/{path.name}"

    def _next_tombstone(self) -> Path:
        """tombstone_00 .. _31: the first free one, else the oldest (tombstoned's rotation)."""
        self.tombstones.mkdir(parents=True, exist_ok=True)
        paths = [self.tombstones / f"tombstone_{i:02d}" for i in range(MAX_TOMBSTONES)]
        for p in paths:
            if not p.exists():
                return p
        return min(paths, key=lambda p: p.stat().st_mtime_ns)
