"""Devices behind adb servers: discovery, shell commands, push and pull.

The device layer in three modules, all re-exported here:

- :mod:`farm.device_transport`: the device's streams (shell v2 with a total deadline, sync push and
  read) and the one place where adb failures become ``DeviceGone``, ``DeviceTimeout`` or ``AdbError``;
- :mod:`farm.device_probe`: ``Device`` (a transport that knows its properties, SoC, HTP arch and
  workspace), ``DeviceInfo`` (what discovery learnt of a device: the one record handed on to the
  pool, ``Pool.sync``, and to ``farm devices``) and the parsers of what a device reports (props, df,
  battery, thermals);
- :mod:`farm.device_discovery`: every device of every adb server, or the one with a given serial.
"""

from __future__ import annotations

from farm.device_discovery import ServerScan, discover, find_device, scan_server
from farm.device_probe import (
    PROBE_TIMEOUT_S,
    PROPS,
    Device,
    DeviceInfo,
    parse_battery,
    parse_df,
    parse_props,
    parse_thermal,
    split_sections,
)
from farm.device_transport import (
    CONNECT_TIMEOUT_S,
    SYNC_DATA_MAX,
    SYNC_PATH_MAX,
    DeviceTransport,
    ShellResult,
    client_for,
    list_server,
)

__all__ = [
    "CONNECT_TIMEOUT_S", "PROBE_TIMEOUT_S", "PROPS", "SYNC_DATA_MAX", "SYNC_PATH_MAX",
    "Device", "DeviceInfo", "DeviceTransport", "ServerScan", "ShellResult",
    "client_for", "discover", "find_device", "list_server", "parse_battery", "parse_df",
    "parse_props", "parse_thermal", "scan_server", "split_sections",
]
