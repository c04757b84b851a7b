"""One ADB stream on the device side, with the protocol's back-pressure in both directions.

Incoming WRTE payloads are queued by the transport's reader thread and OKAYed when a service takes them;
since the server sends the next WRTE of a stream only after our OKAY, at most one payload waits per
stream, so memory stays constant whatever the file size. Outgoing: after each WRTE we wait for the
server's OKAY before the next one.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from farm.virtual.faults import Faults
from farm.virtual.protocol import A_CLSE, A_OKAY, A_WRTE, Transport

log = logging.getLogger(__name__)

_EOF = None


class StreamClosed(Exception):
    """The server closed the stream (or the transport went away) while a service was using it."""


class Stream:
    def __init__(self, transport: Transport, local_id: int, remote_id: int, faults: Faults,
                 on_finished: Callable[[int], None], link: Link | None = None):
        self.transport = transport
        self.local_id = local_id
        self.remote_id = remote_id
        self.faults = faults
        self.link = link or Link()
        self._inbox: queue.Queue[bytearray | None] = queue.Queue()
        self._can_send = threading.Event()
        self._can_send.set()
        self._send_lock = threading.Lock()
        self._close_callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()
        self.remote_closed = threading.Event()
        self._closed = False
        self._on_finished = on_finished
        self.bytes_received = 0

    # --- called by the transport's reader thread -------------------------------------------------
    def deliver(self, payload: bytearray) -> None:
        self.bytes_received += len(payload)
        self._inbox.put(payload)

    def on_okay(self) -> None:
        self._can_send.set()

    def on_remote_close(self) -> None:
        """The server closed the stream, or the transport dropped: wake everyone, run callbacks."""
        self.remote_closed.set()
        self._inbox.put(_EOF)
        self._can_send.set()
        with self._callbacks_lock:
            callbacks, self._close_callbacks = self._close_callbacks, []
        for cb in callbacks:
            cb()

    # --- called by the service ---------------------------------------------------------------------
    def add_close_callback(self, cb: Callable[[], None]) -> None:
        with self._callbacks_lock:
            if not self.remote_closed.is_set():
                self._close_callbacks.append(cb)
                return
        cb()

    def read_chunk(self) -> bytearray | None:
        """The next payload from the server, or None once the stream is closed."""
        chunk = self._inbox.get()
        if chunk is _EOF:
            self._inbox.put(_EOF)  # every later read sees EOF too
            return None
        self._throttle(len(chunk))
        try:
            self.transport.send(A_OKAY, self.local_id, self.remote_id)
        except (OSError, EOFError):
            self.on_remote_close()
            return None
        return chunk

    def write(self, data: bytes | memoryview) -> None:
        """Send ``data`` as one or more WRTE, each at most maxdata, each after the previous OKAY."""
        view = memoryview(data)
        step = self.transport.max_payload
        with self._send_lock:
            for start in range(0, len(view), step):
                piece = view[start:start + step]
                while not self._can_send.wait(0.5):
                    if self.transport.closed.is_set():
                        break
                if self.remote_closed.is_set() or self.transport.closed.is_set():
                    raise StreamClosed(f"stream {self.local_id} closed by the server")
                self._can_send.clear()
                try:
                    self.transport.send(A_WRTE, self.local_id, self.remote_id, piece)
                except (OSError, EOFError) as e:
                    raise StreamClosed(f"transport gone: {e}") from None
                self._throttle(len(piece))

    def close(self) -> None:
        """Close from the device side (service finished). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self.remote_closed.is_set():
            try:
                self.transport.send(A_CLSE, self.local_id, self.remote_id)
            except (OSError, EOFError) as e:
                log.warning("stream %d: close not sent, the transport is gone: %s", self.local_id, e)
        self._inbox.put(_EOF)
        self._on_finished(self.local_id)

    def _throttle(self, nbytes: int) -> None:
        rate = self.faults.slow_bytes_per_s
        if rate:
            self.link.carry(nbytes, rate)


class Link:
    """The device's one link (a phone's USB cable): the ``slow_bytes_per_s`` fault is its rate,
    shared by every stream of the device in both directions, so four pushes in flight get a quarter
    of it each, not four times the cable. Each payload books the link for ``nbytes / rate`` after
    the bookings before it and waits for its turn to end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free_at = 0.0

    def carry(self, nbytes: int, rate: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._free_at = max(self._free_at, now) + nbytes / rate
            done = self._free_at
        time.sleep(max(0.0, done - now))


class StreamReader:
    """Reads a stream as a byte stream, ignoring WRTE boundaries (the sync protocol needs this)."""

    def __init__(self, stream: Stream):
        self._stream = stream
        self._buf = memoryview(b"")

    def _fill(self) -> None:
        chunk = self._stream.read_chunk()
        if chunk is None:
            raise StreamClosed("stream closed mid-request")
        self._buf = memoryview(chunk)

    def read_exact(self, n: int) -> bytes:
        if len(self._buf) >= n:  # the common case: no join
            out = bytes(self._buf[:n])
            self._buf = self._buf[n:]
            return out
        parts = []
        self.copy_to(n, parts.append, copy=True)
        return b"".join(parts)

    def copy_to(self, n: int, sink: Callable[[memoryview], object], copy: bool = False) -> None:
        """Hand the next ``n`` bytes to ``sink`` in pieces, without joining them."""
        while n:
            if not self._buf:
                self._fill()
            take = min(n, len(self._buf))
            piece = self._buf[:take]
            sink(bytes(piece) if copy else piece)
            self._buf = self._buf[take:]
            n -= take
