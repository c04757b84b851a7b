"""The device's streams through an adb server: shell v2 with a total deadline, sync push and read.

Everything goes through adbutils' connection to an adb server (real phones and virtual devices alike).
The protocol loops are our own, each for a reason adbutils cannot serve:

- shell v2 with a *total* deadline: adbutils' ``shell2(timeout=)`` is a per-recv socket timeout, so a
  hung runner that prints a line every few seconds never times out, and a stream that ends without an
  exit packet (device gone) comes back as exit code 255, indistinguishable from the runner's own 255.
- sync SEND: adbutils' ``Sync.push`` sends 4 KiB chunks with ``socket.send`` (not ``sendall``) and
  drops the device's FAIL message ("No space left on device"); we frame 64 KiB DATA chunks (the
  protocol's maximum) sixteen at a time into one reused 1 MiB buffer, one ``sendall`` per block
  (per-chunk Python overhead was ~15 % of a 1 GB push), report progress and keep the message.
- opening a stream: adbutils' ``open_transport`` first asks the server for its version on a second
  connection (~10 ms on the farm's server) and its ``close`` sleeps 10 ms "to let the shutdown be
  processed"; together 20 of the 22 ms a ``shell true`` took. We connect, ask for
  ``host:transport:SERIAL`` (understood by every server version) and close the socket ourselves, with
  ``TCP_NODELAY``: the sync requests are small writes that Nagle held back 40 ms (a delayed ACK) each.

Every failure leaves this module as a farm error (one place maps them, :meth:`DeviceTransport._stream`):
``DeviceGone`` (device not listed or offline), ``DeviceTimeout`` (a command or transfer made no progress
in time), ``AdbServerDown`` (the adb server itself cannot be reached: refused, reset or closed before
answering; named by host:port: not the device's fault), ``AdbError`` (anything else the adb server or
transport reported).
"""

from __future__ import annotations

import logging
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

import adbutils
from adbutils.errors import AdbConnectionError

from farm.config import AdbServerAddress
from farm.device.adb_server import FarmAdbClient, server_unreachable
from farm.errors import AdbError, AdbServerDown, DeviceGone, DeviceTimeout, FarmError, UsageError

log = logging.getLogger(__name__)

SYNC_DATA_MAX = 64 * 1024  # the sync protocol's largest DATA chunk
PUSH_BLOCK_CHUNKS = 16  # DATA chunks framed into one buffer and sent with one sendall (~1 MiB)
SYNC_PATH_MAX = 1024
CONNECT_TIMEOUT_S = 10.0


def client_for(server: AdbServerAddress) -> FarmAdbClient:
    return FarmAdbClient(host=server.host, port=server.port)


def server_error(server: AdbServerAddress, cause: BaseException, *, serial: str | None = None,
                 doing: str = "") -> AdbError:
    """The farm error for a failed request to the adb server itself: ``AdbServerDown`` (naming
    host:port) when the server cannot be reached, else ``AdbError``."""
    if server_unreachable(cause):
        return AdbServerDown(f"adb server {server} unreachable: {doing}{cause or type(cause).__name__} "
                             f"(is `adb -P {server.port} start-server` running on {server.host}?)",
                             serial=serial, server=str(server))
    return AdbError(f"adb server {server}: {doing}{cause}", serial=serial)


def list_server(client: FarmAdbClient, server: AdbServerAddress, *,
                serial: str | None = None) -> list[tuple[str, str]]:
    """(serial, state) of every device the server lists; an unreachable server is ``AdbServerDown``,
    any other failure of the request ``AdbError``."""
    try:
        return [(e.serial, e.state) for e in client.list()]
    except (adbutils.AdbError, OSError, EOFError) as e:
        raise server_error(server, e, serial=serial, doing="listing devices: ") from None


@dataclass(frozen=True)
class ShellResult:
    command: str
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


class _Deadline(Exception):
    pass


def _quick_ack(sock: socket.socket) -> None:
    """Acknowledge what arrives at once (Linux turns this off again after each ACK, so it is set
    before every read). The adb server sends a reply in pieces (a sync RECV's data, then its DONE);
    without it the server's Nagle holds the second piece until our delayed ACK, 40 ms later."""
    if _TCP_QUICKACK is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
        except OSError:
            pass  # not a TCP socket (a test's socketpair): nothing to acknowledge


_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Deadline
        sock.settimeout(remaining)
        _quick_ack(sock)
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            raise _Deadline from None
        if not chunk:
            raise EOFError(f"stream closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


class _Refused(Exception):
    """The adb server answered FAIL (its message is the exception's text)."""


def _request(sock: socket.socket, request: str, deadline: float) -> None:
    """Send one adb server request (hex length + text) and read its OKAY; FAIL is ``_Refused``."""
    data = request.encode()
    sock.sendall(b"%04x" % len(data) + data)
    status = _recv_exact(sock, 4, deadline)
    if status == b"OKAY":
        return
    if status == b"FAIL":
        length = int(_recv_exact(sock, 4, deadline), 16)
        raise _Refused(_recv_exact(sock, length, deadline).decode("utf-8", errors="replace"))
    raise EOFError(f"unexpected adb server reply {status!r}")


def short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True)
class _Block:
    framed: int  # bytes in the buffer, DATA headers included
    data: int  # file bytes among them


def _fill_block(src: BinaryIO, buf: bytearray, view: memoryview) -> _Block | None:
    """Read ``src`` into ``buf`` as consecutive sync DATA frames (header, then up to 64 KiB read
    straight behind it: no copy); stops when the buffer is full or ``src`` ends. None at the end."""
    pos = data = 0
    frame = 8 + SYNC_DATA_MAX
    while pos + frame <= len(buf):
        n = src.readinto(view[pos + 8:pos + frame])
        if not n:
            break
        struct.pack_into("<4sI", buf, pos, b"DATA", n)
        pos += 8 + n
        data += n
    return _Block(pos, data) if data else None


def _still_open(sock: socket.socket) -> bool:
    """An idle stream has nothing to read: EOF, an error or stray bytes all mean it is unusable."""
    previous = sock.gettimeout()
    try:
        sock.settimeout(0)
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        try:
            sock.settimeout(previous)
        except OSError:
            pass
    return False


class DeviceTransport:
    """The streams of one device (``state == "device"``) on one adb server."""

    def __init__(self, client: FarmAdbClient, serial: str, server: AdbServerAddress):
        self.client = client
        self.serial = serial
        self.server = server
        # Sync streams kept open for reuse while some keep_sync() block runs (see there).
        self._sync_lock = threading.Lock()
        self._sync_keepers = 0
        self._sync_idle: list[socket.socket] = []

    def state(self) -> str | None:
        """The adb server's state for this serial ("device", "offline", ...), None if not listed."""
        return dict(list_server(self.client, self.server, serial=self.serial)).get(self.serial)

    def _error(self, kind: type[FarmError], message: str) -> FarmError:
        return kind(f"device {self.serial}: {message}", serial=self.serial)

    def _lost(self, what: str, cause: BaseException) -> FarmError:
        """Classify a broken transport: the device went away, or adb itself failed."""
        why = cause or type(cause).__name__
        try:
            state = self.state()
        except AdbServerDown as e:  # the server went, not the device
            return AdbServerDown(f"{e}; {what} on device {self.serial} broke off: {why}",
                                 serial=self.serial, server=e.server)
        except AdbError as e:
            return e
        if state != "device":
            return DeviceGone(f"device {self.serial} on {self.server} is "
                              f"{state or 'no longer listed'} ({what}: {why})", serial=self.serial)
        return AdbError(f"device {self.serial} on {self.server}: {what} failed: {why}",
                        serial=self.serial)

    def _connect(self, timeout: float) -> socket.socket:
        """A socket to the adb server, switched to this device's transport."""
        try:
            sock = socket.create_connection((self.server.host, self.server.port), timeout=timeout)
        except OSError as e:  # refused, unreachable, timed out: the server's, not the device's
            raise server_error(self.server, AdbConnectionError(f"connect to adb server failed: {e}"),
                               serial=self.serial) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            _request(sock, f"host:transport:{self.serial}", time.monotonic() + timeout)
        except _Refused as e:
            sock.close()
            text = str(e)
            if "not found" in text or "offline" in text or "unauthorized" in text:
                raise DeviceGone(f"device {self.serial} on {self.server}: {text}",
                                 serial=self.serial) from None
            raise server_error(self.server, adbutils.AdbError(text), serial=self.serial) from None
        except (_Deadline, TimeoutError):
            sock.close()
            raise AdbError(f"adb server {self.server} did not answer", serial=self.serial) from None
        except (OSError, EOFError) as e:
            sock.close()
            raise server_error(self.server, e, serial=self.serial) from None
        return sock

    def _open(self, service: str, timeout: float) -> socket.socket:
        """A stream to ``service`` on this device, with adb errors turned into farm errors."""
        connect_timeout = min(timeout, CONNECT_TIMEOUT_S)
        sock = self._connect(connect_timeout)
        try:
            _request(sock, service, time.monotonic() + connect_timeout)
        except (_Refused, _Deadline, OSError, EOFError) as e:
            sock.close()
            raise self._lost(f"opening {service.split(':', 1)[0]}", e) from None
        return sock

    @contextmanager
    def _stream(self, service: str, timeout: float, *, what: Callable[[], str],
                timed_out: Callable[[], str]) -> Iterator[socket.socket]:
        """The socket of a stream to ``service``, closed on the way out; the one place where a stalled
        or broken stream becomes a farm error. ``what`` and ``timed_out`` are asked at failure time,
        so they can tell how far the operation got.

        A ``sync:`` stream is taken from, and after a complete exchange given back to, the streams
        kept by :meth:`keep_sync` while such a block runs; any failure closes it."""
        sync = service == "sync:"
        sock = self._take_sync() if sync else None
        if sock is None:
            sock = self._open(service, timeout)
        completed = False
        try:
            yield sock
            completed = True
        except (TimeoutError, _Deadline):
            raise self._error(DeviceTimeout, timed_out()) from None
        except (EOFError, OSError) as e:
            raise self._lost(what(), e) from None
        finally:
            if not (sync and completed and self._give_back_sync(sock)):
                sock.close()  # adbd sees the stream close (and hangs up on a still-running command)

    # -- sync stream reuse --------------------------------------------------------------------------

    @contextmanager
    def keep_sync(self) -> Iterator[None]:
        """Within this block, pushes and reads of this device reuse sync streams: one that completed
        its exchange stays open for the next, as adb's own client pushes many files over one sync
        session; they are closed when the (outermost) block ends. Opening a stream costs a round trip
        to the server and the device a new sync service (a virtual device: a worker process; 120 ms
        of a 96 MiB push right after a large one, measured). Scoped, not for the transport's life,
        because a device fixes some things when a session opens (a virtual device's free space and
        disk faults), and an idle session holds a service on the device."""
        with self._sync_lock:
            self._sync_keepers += 1
        try:
            yield
        finally:
            with self._sync_lock:
                self._sync_keepers -= 1
                idle = self._sync_idle if self._sync_keepers == 0 else []
                if self._sync_keepers == 0:
                    self._sync_idle = []
            for sock in idle:
                sock.close()

    def _take_sync(self) -> socket.socket | None:
        """A kept sync stream that is still open, if any (a device that rebooted or an adb server that
        restarted has closed it: it then reads as EOF)."""
        while True:
            with self._sync_lock:
                if not self._sync_idle:
                    return None
                sock = self._sync_idle.pop()
            if _still_open(sock):
                return sock
            sock.close()

    def _give_back_sync(self, sock: socket.socket) -> bool:
        with self._sync_lock:
            if self._sync_keepers == 0:
                return False
            self._sync_idle.append(sock)
            return True

    # -- shell --------------------------------------------------------------------------------------

    def shell(self, command: str, *, timeout: float, check: bool = False) -> ShellResult:
        """Run ``sh -c command`` with shell v2 (real exit code, separate stderr).

        ``timeout`` bounds the whole command; when it passes the stream is closed, which makes adbd
        hang up on the command (a virtual device kills its process group) and ``DeviceTimeout`` is
        raised. ``check`` turns a non-zero exit into ``AdbError`` carrying stderr.
        """
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        exit_code: int | None = None
        with self._stream(f"shell,v2,raw:{command}", timeout,
                          what=lambda: f"shell {short(command)!r}",
                          timed_out=lambda: f"command did not finish in {timeout:g} s: "
                                            f"{short(command)}") as sock:
            sock.sendall(b"\x04\x00\x00\x00\x00")  # close-stdin: nothing will be typed
            while exit_code is None:
                header = _recv_exact(sock, 5, deadline)
                length = int.from_bytes(header[1:5], "little")
                data = _recv_exact(sock, length, deadline) if length else b""
                if header[0] == 1:
                    out += data
                elif header[0] == 2:
                    err += data
                elif header[0] == 3:
                    exit_code = data[0] if data else 255
        result = ShellResult(command, exit_code, bytes(out), bytes(err))
        if check and exit_code != 0:
            raise self._error(AdbError, f"{short(command)!r} exited {exit_code}: "
                                        f"{short(result.err.strip() or result.out.strip())}")
        return result

    def reboot(self, *, timeout: float = CONNECT_TIMEOUT_S) -> None:
        """``adb reboot``: the ``reboot:`` service, as adb's client opens it. Not a shell command: it
        reaches a phone whose shell no longer answers. Returns once the device took the request (it
        closes the stream, or drops its transport, as it goes down)."""
        with self._stream("reboot:", timeout, what=lambda: "reboot",
                          timed_out=lambda: f"reboot request not taken in {timeout:g} s") as sock:
            sock.settimeout(timeout)
            try:
                while sock.recv(4096):
                    pass
            except (ConnectionResetError, BrokenPipeError):
                pass  # the device went down under the request: that is what was asked

    # -- files ------------------------------------------------------------------------------------

    def push(self, src: BinaryIO, remote: str, *, mode: int = 0o644, timeout: float = 60.0,
             on_bytes: Callable[[int], None] | None = None, mtime: int | None = None) -> int:
        """Stream ``src`` to ``remote`` (parents created by adbd); returns the bytes sent.

        Memory stays constant (one ~1 MiB buffer). ``timeout`` is an inactivity timeout: a multi-GB
        push may take minutes, but no single send or the final status may stall longer than that.
        ``mtime`` (default: now) is what adbd sets as the file's modification time.
        """
        target = f"{remote},{stat.S_IFREG | mode}".encode()
        if len(target) > SYNC_PATH_MAX:
            raise UsageError(f"device path too long for adb sync ({len(target)} bytes): {remote}")
        total = 0
        with self._stream("sync:", timeout, what=lambda: f"push to {remote} after {total} bytes",
                          timed_out=lambda: f"push to {remote} stalled for {timeout:g} s "
                                            f"after {total} bytes") as sock:
            sock.settimeout(timeout)
            sock.sendall(b"SEND" + struct.pack("<I", len(target)) + target)
            frame = 8 + SYNC_DATA_MAX
            buf = bytearray(frame * PUSH_BLOCK_CHUNKS)
            view = memoryview(buf)
            while block := _fill_block(src, buf, view):
                sock.sendall(view[:block.framed])
                total += block.data
                if on_bytes:  # in pieces of at most one DATA chunk, as callers have always seen
                    for start in range(0, block.data, SYNC_DATA_MAX):
                        on_bytes(min(SYNC_DATA_MAX, block.data - start))
            stamp = int(time.time()) if mtime is None else mtime
            sock.sendall(b"DONE" + struct.pack("<I", stamp & 0xFFFFFFFF))
            status = _recv_exact(sock, 8, time.monotonic() + timeout)
            if status[:4] == b"FAIL":
                length = struct.unpack("<I", status[4:])[0]
                message = _recv_exact(sock, length, time.monotonic() + timeout).decode(
                    "utf-8", errors="replace")
                raise self._error(AdbError, f"push to {remote} failed: {message}")
            if status[:4] != b"OKAY":
                raise self._error(AdbError, f"push to {remote}: unexpected reply {status[:4]!r}")
        return total

    def read_file(self, remote: str, *, timeout: float = 60.0, limit: int = 256 << 20) -> bytes:
        """The content of a (small) file on the device. A missing file is ``AdbError``."""
        path = remote.encode()
        data = bytearray()
        deadline = time.monotonic() + timeout
        with self._stream("sync:", timeout, what=lambda: f"reading {remote}",
                          timed_out=lambda: f"reading {remote} took over {timeout:g} s") as sock:
            sock.sendall(b"RECV" + struct.pack("<I", len(path)) + path)
            while True:
                header = _recv_exact(sock, 8, deadline)
                kind, length = header[:4], struct.unpack("<I", header[4:])[0]
                if kind == b"DONE":
                    break
                if kind == b"FAIL":
                    message = _recv_exact(sock, length, deadline).decode("utf-8", errors="replace")
                    raise self._error(AdbError, f"cannot read {remote}: {message}")
                if kind != b"DATA":
                    raise self._error(AdbError, f"reading {remote}: unexpected {kind!r}")
                data += _recv_exact(sock, length, deadline)
                if len(data) > limit:
                    raise self._error(AdbError, f"{remote} is larger than {limit} bytes")
        return bytes(data)
