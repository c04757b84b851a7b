"""Devices behind adb servers: discovery, shell commands, push and pull.

Everything goes through adbutils' connection to an adb server (real phones and virtual devices alike).
Two protocol loops are our own, each for a reason adbutils cannot serve:

- shell v2 with a *total* deadline: adbutils' ``shell2(timeout=)`` is a per-recv socket timeout, so a
  hung runner that prints a line every few seconds never times out, and a stream that ends without an
  exit packet (device gone) comes back as exit code 255, indistinguishable from the runner's own 255.
- sync SEND: adbutils' ``Sync.push`` sends 4 KiB chunks with ``socket.send`` (not ``sendall``) and
  drops the device's FAIL message ("No space left on device"); we send 64 KiB chunks (the protocol's
  maximum) from a reused buffer, report progress and keep the message.

Every failure leaves this module as a farm error: ``DeviceGone`` (device not listed or offline),
``DeviceTimeout`` (a command or transfer made no progress in time), ``AdbError`` (anything else the adb
server or transport reported, including an unreachable server, named by host:port).
"""

from __future__ import annotations

import shlex
import socket
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

import adbutils
from adbutils import AdbConnection

from farm.adb_server import FarmAdbClient
from farm.config import DEFAULT_WORKSPACE, AdbServerAddress
from farm.errors import AdbError, DeviceGone, DeviceTimeout, FarmError, UsageError
from farm.soc import htp_arch, soc_from_props

SYNC_DATA_MAX = 64 * 1024  # the sync protocol's largest DATA chunk
SYNC_PATH_MAX = 1024
PROBE_TIMEOUT_S = 20.0
CONNECT_TIMEOUT_S = 10.0

PROPS = (
    "ro.soc.model", "ro.soc.manufacturer", "ro.board.platform", "ro.product.model",
    "ro.build.version.release", "ro.build.version.sdk", "ro.product.cpu.abi",
    "ro.ptefarm.virtual", "ro.ptefarm.workspace",
)


def client_for(server: AdbServerAddress) -> FarmAdbClient:
    return FarmAdbClient(host=server.host, port=server.port)


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


@dataclass
class DeviceInfo:
    serial: str
    server: str
    state: str = "device"
    soc: str | None = None
    htp_arch: str | None = None
    platform: str | None = None
    model: str | None = None
    android_release: str | None = None
    sdk: int | None = None
    abi: str | None = None
    virtual: bool = False
    workspace: str | None = None
    free_bytes: int | None = None
    battery_level: int | None = None
    battery_temp_c: float | None = None
    thermal: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ServerScan:
    """What one adb server reported: its devices, or why it could not be asked."""

    server: AdbServerAddress
    devices: list[DeviceInfo]
    error: str | None = None


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


class Device:
    """One device (``state == "device"``) on one adb server."""

    def __init__(self, client: FarmAdbClient, serial: str, server: AdbServerAddress, *,
                 workspace_root: str = DEFAULT_WORKSPACE):
        self.client = client
        self.serial = serial
        self.server = server
        self.workspace_root = workspace_root
        self._adb = adbutils.AdbDevice(client, serial=serial)
        self._props: dict[str, str] | None = None

    def __repr__(self) -> str:
        return f"Device({self.serial!r} on {self.server})"

    # -- errors -----------------------------------------------------------------------------------

    def state(self) -> str | None:
        """The adb server's state for this serial ("device", "offline", ...), None if not listed."""
        try:
            for entry in self.client.list():
                if entry.serial == self.serial:
                    return entry.state
        except (adbutils.AdbError, OSError) as e:
            raise AdbError(f"adb server {self.server} unreachable: {e}", serial=self.serial) from None
        return None

    def _lost(self, what: str, cause: BaseException) -> FarmError:
        """Classify a broken transport: the device went away, or adb itself failed."""
        try:
            state = self.state()
        except AdbError as e:
            return e
        if state != "device":
            return DeviceGone(f"device {self.serial} on {self.server} is "
                              f"{state or 'no longer listed'} ({what}: {cause or type(cause).__name__})",
                              serial=self.serial)
        return AdbError(f"device {self.serial} on {self.server}: {what} failed: "
                        f"{cause or type(cause).__name__}", serial=self.serial)

    def _open(self, service: str, timeout: float) -> AdbConnection:
        """A stream to ``service`` on this device, with adb errors turned into farm errors."""
        try:
            conn = self._adb.open_transport(timeout=min(timeout, CONNECT_TIMEOUT_S))
        except adbutils.AdbTimeout:
            raise AdbError(f"adb server {self.server} did not answer", serial=self.serial) from None
        except (adbutils.AdbError, OSError) as e:
            if "not found" in str(e) or "offline" in str(e) or "unauthorized" in str(e):
                raise DeviceGone(f"device {self.serial} on {self.server}: {e}",
                                 serial=self.serial) from None
            raise AdbError(f"adb server {self.server}: {e}", serial=self.serial) from None
        try:
            conn.send_command(service)
            conn.check_okay()
        except adbutils.AdbError as e:
            conn.close()
            raise self._lost(f"opening {service.split(':', 1)[0]}", e) from None
        except OSError as e:
            conn.close()
            raise self._lost(f"opening {service.split(':', 1)[0]}", e) from None
        return conn

    # -- shell --------------------------------------------------------------------------------------

    def shell(self, command: str, *, timeout: float, check: bool = False) -> ShellResult:
        """Run ``sh -c command`` with shell v2 (real exit code, separate stderr).

        ``timeout`` bounds the whole command; when it passes the stream is closed, which makes adbd
        hang up on the command (a virtual device kills its process group) and ``DeviceTimeout`` is
        raised. ``check`` turns a non-zero exit into ``AdbError`` carrying stderr.
        """
        deadline = time.monotonic() + timeout
        conn = self._open(f"shell,v2,raw:{command}", timeout)
        out, err = bytearray(), bytearray()
        exit_code: int | None = None
        try:
            sock = conn.conn
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
        except _Deadline:
            raise DeviceTimeout(f"device {self.serial}: command did not finish in {timeout:g} s: "
                                f"{_short(command)}", serial=self.serial) from None
        except (EOFError, OSError) as e:
            raise self._lost(f"shell {_short(command)!r}", e) from None
        finally:
            conn.close()
        result = ShellResult(command, exit_code, bytes(out), bytes(err))
        if check and exit_code != 0:
            raise AdbError(f"device {self.serial}: {_short(command)!r} exited {exit_code}: "
                           f"{_short(result.err.strip() or result.out.strip())}", serial=self.serial)
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
        conn = self._open("sync:", timeout)
        total = 0
        try:
            sock = conn.conn
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
                raise AdbError(f"device {self.serial}: push to {remote} failed: {message}",
                               serial=self.serial)
            if status[:4] != b"OKAY":
                raise AdbError(f"device {self.serial}: push to {remote}: unexpected reply "
                               f"{status[:4]!r}", serial=self.serial)
        except (TimeoutError, _Deadline):
            raise DeviceTimeout(f"device {self.serial}: push to {remote} stalled for {timeout:g} s "
                                f"after {total} bytes", serial=self.serial) from None
        except (EOFError, OSError) as e:
            raise self._lost(f"push to {remote} after {total} bytes", e) from None
        finally:
            conn.close()
        return total

    def read_file(self, remote: str, *, timeout: float = 60.0, limit: int = 256 << 20) -> bytes:
        """The content of a (small) file on the device. A missing file is ``AdbError``."""
        conn = self._open("sync:", timeout)
        path = remote.encode()
        data = bytearray()
        deadline = time.monotonic() + timeout
        try:
            sock = conn.conn
            sock.sendall(b"RECV" + struct.pack("<I", len(path)) + path)
            while True:
                header = _recv_exact(sock, 8, deadline)
                kind, length = header[:4], struct.unpack("<I", header[4:])[0]
                if kind == b"DONE":
                    break
                if kind == b"FAIL":
                    message = _recv_exact(sock, length, deadline).decode("utf-8", errors="replace")
                    raise AdbError(f"device {self.serial}: cannot read {remote}: {message}",
                                   serial=self.serial)
                if kind != b"DATA":
                    raise AdbError(f"device {self.serial}: reading {remote}: unexpected {kind!r}",
                                   serial=self.serial)
                data += _recv_exact(sock, length, deadline)
                if len(data) > limit:
                    raise AdbError(f"device {self.serial}: {remote} is larger than {limit} bytes",
                                   serial=self.serial)
        except _Deadline:
            raise DeviceTimeout(f"device {self.serial}: reading {remote} took over {timeout:g} s",
                                serial=self.serial) from None
        except (EOFError, OSError) as e:
            raise self._lost(f"reading {remote}", e) from None
        finally:
            conn.close()
        return bytes(data)

    # -- properties -------------------------------------------------------------------------------

    def props(self, *, refresh: bool = False) -> dict[str, str]:
        """The system properties the farm uses (one shell call, cached)."""
        if self._props is None or refresh:
            script = "; ".join(f"printf '%s=%s\\n' {p} \"$(getprop {p})\"" for p in PROPS)
            result = self.shell(script, timeout=PROBE_TIMEOUT_S, check=True)
            props: dict[str, str] = {}
            for line in result.out.splitlines():
                key, sep, value = line.partition("=")
                if sep and key in PROPS:
                    props[key] = value.strip()
            self._props = props
        return self._props

    @property
    def is_virtual(self) -> bool:
        return self.props().get("ro.ptefarm.virtual") == "1"

    @property
    def workspace(self) -> str:
        """The farm's workspace on this device; a virtual device names its own (a host path)."""
        own = self.props().get("ro.ptefarm.workspace") if self.is_virtual else None
        return own or self.workspace_root

    @property
    def soc(self) -> str | None:
        return soc_from_props(self.props())

    @property
    def htp_arch(self) -> str | None:
        return htp_arch(self.soc)

    def info(self) -> DeviceInfo:
        """Everything the farm knows about this device; unreadable attributes are None."""
        props = self.props(refresh=True)
        ws = self.workspace
        q = shlex.quote(ws)
        probe = (f"mkdir -p {q} 2>/dev/null; echo @@df; df -k {q} 2>/dev/null; "
                 "echo @@battery; dumpsys battery 2>/dev/null; echo @@thermal; "
                 "for z in /sys/class/thermal/thermal_zone*; do "
                 "[ -r \"$z/temp\" ] && echo \"${z##*/}=$(cat \"$z/type\" 2>/dev/null)="
                 "$(cat \"$z/temp\" 2>/dev/null)\"; done; true")
        sections = split_sections(self.shell(probe, timeout=PROBE_TIMEOUT_S).out)
        battery = parse_battery(sections.get("battery", ""))
        sdk = props.get("ro.build.version.sdk", "")
        soc = soc_from_props(props)
        return DeviceInfo(
            serial=self.serial, server=str(self.server), soc=soc, htp_arch=htp_arch(soc),
            platform=props.get("ro.board.platform") or None,
            model=props.get("ro.product.model") or None,
            android_release=props.get("ro.build.version.release") or None,
            sdk=int(sdk) if sdk.isdigit() else None, abi=props.get("ro.product.cpu.abi") or None,
            virtual=self.is_virtual, workspace=ws, free_bytes=parse_df(sections.get("df", "")),
            battery_level=battery[0], battery_temp_c=battery[1],
            thermal=parse_thermal(sections.get("thermal", "")))


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def split_sections(output: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.splitlines():
        if line.startswith("@@"):
            current = sections.setdefault(line[2:].strip(), [])
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def parse_df(text: str) -> int | None:
    """Free bytes from ``df -k PATH`` (a long filesystem name may wrap the data line)."""
    lines = text.strip().splitlines()
    fields = " ".join(lines[1:]).split()
    if len(fields) < 6 or not fields[-3].isdigit():
        return None
    return int(fields[-3]) * 1024


def parse_battery(text: str) -> tuple[int | None, float | None]:
    """(level %, temperature in deg C) from ``dumpsys battery`` (temperature is in tenths)."""
    level: int | None = None
    temp: float | None = None
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "level" and value.lstrip("-").isdigit():
            level = int(value)
        elif key == "temperature" and value.lstrip("-").isdigit():
            temp = int(value) / 10.0
    return level, temp


def parse_thermal(text: str) -> dict[str, float]:
    """``thermal_zoneN=type=temp`` lines -> {type: deg C}; millidegrees are the kernel's unit."""
    zones: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.strip().split("=")
        if len(parts) < 3:
            continue
        zone, kind, raw = parts[0], "=".join(parts[1:-1]).strip(), parts[-1].strip()
        try:
            value = float(raw)
        except ValueError:
            continue
        name = kind or zone
        if name in zones:
            name = f"{name}#{zone.removeprefix('thermal_zone')}"
        zones[name] = value / 1000.0 if abs(value) >= 1000 else value
    return zones


# -- discovery ------------------------------------------------------------------------------------

def _list_server(server: AdbServerAddress) -> tuple[FarmAdbClient, list[tuple[str, str]]]:
    client = client_for(server)
    try:
        entries = client.list()
    except (adbutils.AdbError, OSError) as e:
        raise AdbError(f"adb server {server} unreachable: {e} "
                       f"(is `adb -P {server.port} start-server` running on {server.host}?)") from None
    return client, [(e.serial, e.state) for e in entries]


def scan_server(server: AdbServerAddress, *, workspace_root: str = DEFAULT_WORKSPACE) -> ServerScan:
    """Every device of one adb server with its attributes; an unreachable server is an error entry."""
    try:
        client, entries = _list_server(server)
    except AdbError as e:
        return ServerScan(server, [], error=str(e))
    devices = []
    for serial, state in entries:
        if state != "device":
            devices.append(DeviceInfo(serial=serial, server=str(server), state=state))
            continue
        try:
            devices.append(Device(client, serial, server, workspace_root=workspace_root).info())
        except FarmError as e:
            devices.append(DeviceInfo(serial=serial, server=str(server), state="error", error=str(e)))
    return ServerScan(server, devices)


def discover(servers: list[AdbServerAddress], *,
             workspace_root: str = DEFAULT_WORKSPACE) -> list[DeviceInfo]:
    """Every device of every server. An unreachable server raises ``AdbError`` naming host:port."""
    found: list[DeviceInfo] = []
    for server in servers:
        scan = scan_server(server, workspace_root=workspace_root)
        if scan.error:
            raise AdbError(scan.error)
        found.extend(scan.devices)
    return found


def find_device(servers: list[AdbServerAddress], serial: str, *,
                workspace_root: str = DEFAULT_WORKSPACE) -> Device:
    """The device with this serial on whichever server has it.

    Not listed anywhere is a ``UsageError`` (a wrong serial) unless some server could not be asked,
    which makes it an ``AdbError``; listed but not ready (offline, unauthorized) is ``DeviceGone``.
    """
    unreachable: list[str] = []
    for server in servers:
        try:
            client, entries = _list_server(server)
        except AdbError as e:
            unreachable.append(str(e))
            continue
        for s, state in entries:
            if s == serial:
                if state != "device":
                    raise DeviceGone(f"device {serial} on {server} is {state}", serial=serial)
                return Device(client, serial, server, workspace_root=workspace_root)
    names = ", ".join(str(s) for s in servers)
    if unreachable:
        raise AdbError(f"device {serial} not found on adb servers {names}; "
                       + "; ".join(unreachable), serial=serial)
    raise UsageError(f"device {serial} not found on adb servers {names} (see `farm devices`)")
