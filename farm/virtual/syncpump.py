"""The device side of a ``sync:`` session: the ADB stream pumped to and from the sync worker
(farm.virtual.syncd, inside the device's view), in payloads up to maxdata and through 1 MiB pipes.

Starting a worker (entering the view, an interpreter, its imports) takes tens of milliseconds, more
than a small push itself; a deploy opens one session per file. So the device keeps one worker started
ahead of need (:class:`WarmWorkers`): a session takes it and a replacement starts in the background."""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import threading
from pathlib import Path

from farm.virtual.stream import Stream, StreamClosed
from farm.virtual.sync import IO_BUFFER

log = logging.getLogger(__name__)

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _grow_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, IO_BUFFER)
    except OSError as e:  # over /proc/sys/fs/pipe-max-size: slower, still correct
        log.debug("pipe of %d bytes refused: %s", IO_BUFFER, e)


def start_worker(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen:
    """A sync worker waiting for its session header (``argv``: syncd, possibly entered into a view)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=cwd,
                            bufsize=0, start_new_session=True)
    for pipe in (proc.stdin, proc.stdout):
        _grow_pipe(pipe.fileno())
    return proc


class WarmWorkers:
    """Sync workers kept started ahead of need, ``depth`` of them (one: keeping three for a deploy's
    three files in flight measured no faster, and every device would pay for them). ``take`` hands one out (or starts one when none is ready) and starts
    a replacement in the background. ``close`` ends the idle ones (EOF before a header: they exit 0)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path | None = None, depth: int = 1):
        self.argv, self.env, self.cwd, self.depth = argv, env, cwd, depth
        self._lock = threading.Lock()
        self._ready: list[subprocess.Popen] = []
        self._closed = False
        self._refill()

    def take(self) -> subprocess.Popen:
        proc = None
        with self._lock:
            while self._ready and proc is None:
                candidate = self._ready.pop(0)
                if candidate.poll() is None:
                    proc = candidate
        if proc is None:
            proc = start_worker(self.argv, self.env, self.cwd)
        threading.Thread(target=self._refill, daemon=True).start()
        return proc

    def _refill(self) -> None:
        while True:
            with self._lock:
                if self._closed or len(self._ready) >= self.depth:
                    return
            try:
                proc = start_worker(self.argv, self.env, self.cwd)
            except OSError as e:
                log.warning("sync worker %s could not start ahead: %s", self.argv[0], e)
                return
            with self._lock:
                if not self._closed and len(self._ready) < self.depth:
                    self._ready.append(proc)
                    continue
            _end_idle(proc)  # closed meanwhile, or another refill filled the pool
            return

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._ready = self._ready, []
        for proc in idle:
            _end_idle(proc)


def _end_idle(proc: subprocess.Popen) -> None:
    _close_quietly(proc.stdin)
    _close_quietly(proc.stdout)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def serve_sync(stream: Stream, workers: WarmWorkers, header: bytes) -> None:
    """Serve one ``sync:`` stream by a worker: ``header`` (the session's limits) first, then
    server -> worker stdin, worker stdout -> server, each in payloads up to maxdata."""
    try:
        proc = workers.take()
        _write_all(proc.stdin.fileno(), memoryview(header))
    except OSError as e:
        log.error("sync worker %s could not start: %s", workers.argv[0], e)
        stream.close()
        return
    assert proc.stdin is not None and proc.stdout is not None
    stream.add_close_callback(lambda: _close_quietly(proc.stdin))

    def feed() -> None:
        try:
            while (chunk := stream.read_chunk()) is not None:
                _write_all(proc.stdin.fileno(), memoryview(chunk))
        except (OSError, ValueError) as e:  # the worker ended (QUIT, a bad packet), or we closed it
            log.debug("sync worker input closed: %s", e)
        finally:
            _close_quietly(proc.stdin)  # EOF: the worker cleans up and exits

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    out = proc.stdout.fileno()
    try:
        while data := os.read(out, stream.transport.max_payload):
            stream.write(data)
    except (StreamClosed, OSError) as e:
        log.info("sync stream ended while sending: %s", e)
    finally:
        _close_quietly(proc.stdout)
        _close_quietly(proc.stdin)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if code:
            log.warning("sync worker exited %d", code)
        stream.close()


def _close_quietly(f) -> None:
    try:
        f.close()
    except OSError as e:
        log.debug("close: %s", e)
