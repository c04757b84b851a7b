"""Finding devices: every device of every adb server, or the one with a given serial."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from farm.config import DEFAULT_WORKSPACE, AdbServerAddress
from farm.device.adb_server import FarmAdbClient
from farm.device.probe import Device, DeviceInfo
from farm.device.transport import client_for, list_server
from farm.errors import AdbError, AdbServerDown, DeviceGone, FarmError, UsageError

log = logging.getLogger(__name__)

# Probes of one server's devices in flight at once (each holds a connection to the adb server).
MAX_PARALLEL_PROBES = 16


@dataclass
class ServerScan:
    """What one adb server reported: its devices, or why it could not be asked."""

    server: AdbServerAddress
    devices: list[DeviceInfo]
    error: str | None = None
    failure: AdbError | None = field(default=None, repr=False)  # the error itself (AdbServerDown...)


def _listing(server: AdbServerAddress) -> tuple[FarmAdbClient, list[tuple[str, str]]]:
    client = client_for(server)
    return client, list_server(client, server)


def scan_server(server: AdbServerAddress, *, workspace_root: str = DEFAULT_WORKSPACE) -> ServerScan:
    """Every device of one adb server with its attributes; an unreachable server is an error entry."""
    try:
        client, entries = _listing(server)
    except AdbError as e:
        return ServerScan(server, [], error=str(e), failure=e)

    def probe(entry: tuple[str, str]) -> DeviceInfo:
        serial, state = entry
        if state != "device":
            return DeviceInfo(serial=serial, server=str(server), state=state)
        try:
            return Device(client, serial, server, workspace_root=workspace_root).info()
        except FarmError as e:
            log.warning("device %s on %s: cannot probe it: %s", serial, server, e)
            return DeviceInfo(serial=serial, server=str(server), state="error", error=str(e))

    # Devices are probed side by side: each probe is a few shell round trips spent waiting on its
    # device, and a session start-up waits for the slowest server's scan (8 devices: 0.26 s
    # one after another).
    if len(entries) <= 1:
        devices = [probe(e) for e in entries]
    else:
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_PROBES, len(entries)),
                                thread_name_prefix="probe") as pool:
            devices = list(pool.map(probe, entries))
    return ServerScan(server, devices)


def discover(servers: list[AdbServerAddress], *,
             workspace_root: str = DEFAULT_WORKSPACE) -> list[DeviceInfo]:
    """Every device of every server. An unreachable server raises ``AdbServerDown`` naming host:port
    (another failure of the server's listing, ``AdbError``)."""
    found: list[DeviceInfo] = []
    for server in servers:
        scan = scan_server(server, workspace_root=workspace_root)
        if scan.error:
            raise scan.failure or AdbError(scan.error)
        found.extend(scan.devices)
    return found


def find_device(servers: list[AdbServerAddress], serial: str, *,
                workspace_root: str = DEFAULT_WORKSPACE) -> Device:
    """The device with this serial on whichever server has it.

    Not listed anywhere is a ``UsageError`` (a wrong serial) unless some server could not be asked,
    which makes it an ``AdbError`` (``AdbServerDown`` when a server is down: the device may well be
    there); listed but not ready (offline, unauthorized) is ``DeviceGone``.
    """
    unreachable: list[AdbError] = []
    for server in servers:
        try:
            client, entries = _listing(server)
        except AdbError as e:
            log.warning("%s; looking for %s on the other servers", e, serial)
            unreachable.append(e)
            continue
        for s, state in entries:
            if s == serial:
                if state != "device":
                    raise DeviceGone(f"device {serial} on {server} is {state}", serial=serial)
                return Device(client, serial, server, workspace_root=workspace_root)
    names = ", ".join(str(s) for s in servers)
    if unreachable:
        message = f"device {serial} not found on adb servers {names}; " + \
            "; ".join(str(e) for e in unreachable)
        down = [e for e in unreachable if isinstance(e, AdbServerDown)]
        if down:
            raise AdbServerDown(message, serial=serial, server=", ".join(
                str(e.server) for e in down))
        raise AdbError(message, serial=serial)
    raise UsageError(f"device {serial} not found on adb servers {names} (see `farm devices`)")
