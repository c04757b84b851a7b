"""The device's streams through an adb server: shell v2 with a total deadline, sync push and read.

Everything goes through adbutils' connection to an adb server (real phones and virtual devices alike).
The protocol loops are our own, each for a reason adbutils cannot serve:

- shell v2 with a *total* deadline: adbutils' ``shell2(timeout=)`` is a per-recv socket timeout, so a
  hung runner that prints a line every few seconds never times out, and a stream that ends without an
  exit packet (device gone) comes back as exit code 255, indistinguishable from the runner's own 255.
- sync SEND: adbutils' ``Sync.push`` sends 4 KiB chunks with ``socket.send`` (not ``sendall``) and
  drops the device's FAIL message ("No space left on device"); we send 64 KiB chunks (the protocol's
  maximum) from a reused buffer, report progress and keep the message.

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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

import adbutils
from adbutils import AdbConnection

from farm.adb_server import FarmAdbClient, server_unreachable
from farm.config import AdbServerAddress
from farm.errors import AdbError, AdbServerDown, DeviceGone, DeviceTimeout, FarmError, UsageError

log = logging.getLogger(__name__)

SYNC_DATA_MAX = 64 * 1024  # the sync protocol's largest DATA chunk
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


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Deadline
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            raise _Deadline from None
        if not chunk:
            raise EOFError(f"stream closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class DeviceTransport:
    """The streams of one device (``state == "device"``) on one adb server."""

    def __init__(self, client: FarmAdbClient, serial: str, server: AdbServerAddress):
        self.client = client
        self.serial = serial
        self.server = server
        self._adb = adbutils.AdbDevice(client, serial=serial)

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

    def _open(self, service: str, timeout: float) -> AdbConnection:
        """A stream to ``service`` on this device, with adb errors turned into farm errors."""
        try:
            conn = self._adb.open_transport(timeout=min(timeout, CONNECT_TIMEOUT_S))
        except adbutils.AdbTimeout as e:
            if server_unreachable(e):
                raise server_error(self.server, e, serial=self.serial) from None
            raise AdbError(f"adb server {self.server} did not answer", serial=self.serial) from None
        except (adbutils.AdbError, OSError, EOFError) as e:
            if "not found" in str(e) or "offline" in str(e) or "unauthorized" in str(e):
                raise DeviceGone(f"device {self.serial} on {self.server}: {e}",
                                 serial=self.serial) from None
            raise server_error(self.server, e, serial=self.serial) from None
        try:
            conn.send_command(service)
            conn.check_okay()
        except (adbutils.AdbError, OSError) as e:
            conn.close()
            raise self._lost(f"opening {service.split(':', 1)[0]}", e) from None
        return conn

    @contextmanager
    def _stream(self, service: str, timeout: float, *, what: Callable[[], str],
                timed_out: Callable[[], str]) -> Iterator[socket.socket]:
        """The socket of a stream to ``service``, closed on the way out; the one place where a stalled
        or broken stream becomes a farm error. ``what`` and ``timed_out`` are asked at failure time,
        so they can tell how far the operation got."""
        conn = self._open(service, timeout)
        try:
            yield conn.conn
        except (TimeoutError, _Deadline):
            raise self._error(DeviceTimeout, timed_out()) from None
        except (EOFError, OSError) as e:
            raise self._lost(what(), e) from None
        finally:
            conn.close()

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

    # -- files ------------------------------------------------------------------------------------

    def push(self, src: BinaryIO, remote: str, *, mode: int = 0o644, timeout: float = 60.0,
             on_bytes: Callable[[int], None] | None = None, mtime: int | None = None) -> int:
        """Stream ``src`` to ``remote`` (parents created by adbd); returns the bytes sent.

        Memory stays constant (one 64 KiB buffer). ``timeout`` is an inactivity timeout: a multi-GB
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
            buf = bytearray(8 + SYNC_DATA_MAX)
            view = memoryview(buf)
            while n := src.readinto(view[8:]):
                struct.pack_into("<4sI", buf, 0, b"DATA", n)
                sock.sendall(view[:8 + n])
                total += n
                if on_bytes:
                    on_bytes(n)
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
