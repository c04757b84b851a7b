"""The device side of a ``sync:`` session: the ADB stream pumped to and from the sync worker
(farm.virtual.syncd, inside the device's view), in payloads up to maxdata and through 1 MiB pipes."""

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


def serve_sync(stream: Stream, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
    """Serve one ``sync:`` stream by a worker (``argv``: syncd, possibly entered into a view):
    server -> worker stdin, worker stdout -> server, each in payloads up to maxdata."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                cwd=cwd, bufsize=0, start_new_session=True)
    except OSError as e:
        log.error("sync worker %s could not start: %s", argv[0], e)
        stream.close()
        return
    assert proc.stdin is not None and proc.stdout is not None
    for pipe in (proc.stdin, proc.stdout):
        _grow_pipe(pipe.fileno())
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
