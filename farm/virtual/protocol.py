"""ADB transport messages, device side: framing, the CNXN banner, and a socket transport.

Follows AOSP adb's protocol.txt as summarised in /work/shared/docs/adb-device-protocol.md: a 24-byte
header of six little-endian u32 (command, arg0, arg1, data_length, data_check, magic) then the payload.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

A_CNXN = 0x4E584E43
A_AUTH = 0x48545541
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257

A_VERSION = 0x01000001  # skips data_check on WRTE: the server validates only magic and length
MAX_PAYLOAD = 1024 * 1024  # advertise 1 MiB: small payloads make pushes an order of magnitude slower
DEVICE_FEATURES = ("shell_v2", "stat_v2", "ls_v2", "fixed_push_mkdir")

_HEADER = struct.Struct("<6I")
HEADER_SIZE = _HEADER.size

COMMAND_NAMES = {A_CNXN: "CNXN", A_AUTH: "AUTH", A_OPEN: "OPEN", A_OKAY: "OKAY",
                 A_CLSE: "CLSE", A_WRTE: "WRTE"}


class ProtocolError(Exception):
    """The peer sent something that is not an ADB message; the connection is dropped."""


@dataclass(frozen=True)
class Message:
    command: int
    arg0: int
    arg1: int
    payload: bytes | bytearray = b""

    @property
    def name(self) -> str:
        return COMMAND_NAMES.get(self.command, hex(self.command))


def pack_header(command: int, arg0: int, arg1: int, payload_len: int, check: int = 0) -> bytes:
    return _HEADER.pack(command, arg0, arg1, payload_len, check, command ^ 0xFFFFFFFF)


def checksum(payload: bytes) -> int:
    return sum(payload) & 0xFFFFFFFF


def device_banner(props: dict[str, str]) -> bytes:
    """The CNXN payload announcing this device: product name/model/device and our features."""
    fields = [f"{key}={props.get(key, '')}" for key in
              ("ro.product.name", "ro.product.model", "ro.product.device")]
    fields.append("features=" + ",".join(DEVICE_FEATURES))
    banner = ("device::" + ";".join(fields)).encode()
    if len(banner) >= 4096 or b":" in banner[len("device::"):]:
        raise ValueError(f"device banner invalid (':' in a value or >= 4096 bytes): {banner!r}")
    return banner


class Transport:
    """One TCP connection to the adb server. Reads are done by one thread; writes are serialised."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._send_lock = threading.Lock()
        self.max_payload = MAX_PAYLOAD
        self.closed = threading.Event()

    def _recv_exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise EOFError("adb server closed the connection")
            got += k
        return buf

    def read_message(self) -> Message:
        command, arg0, arg1, length, _check, magic = _HEADER.unpack(self._recv_exact(HEADER_SIZE))
        if magic != command ^ 0xFFFFFFFF:
            raise ProtocolError(f"bad magic in header of command {command:#x}")
        if length > MAX_PAYLOAD:
            raise ProtocolError(f"payload of {length} bytes exceeds {MAX_PAYLOAD}")
        payload = self._recv_exact(length) if length else b""
        return Message(command, arg0, arg1, payload)

    def send(self, command: int, arg0: int, arg1: int, payload: bytes | memoryview = b"",
             *, with_checksum: bool = False) -> None:
        if len(payload) > self.max_payload:
            # Never exceed what was negotiated: the server silently stops serving the transport.
            raise ValueError(f"payload of {len(payload)} bytes exceeds maxdata {self.max_payload}")
        check = checksum(bytes(payload)) if with_checksum else 0
        header = pack_header(command, arg0, arg1, len(payload), check)
        with self._send_lock:
            if self.closed.is_set():
                raise EOFError("transport closed")
            self.sock.sendall(header)
            if payload:
                self.sock.sendall(payload)

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError as e:
            log.debug("transport shutdown: %s (the peer already hung up)", e)
        self.sock.close()
