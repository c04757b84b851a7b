"""Virtual Snapdragon devices: processes speaking the device side of ADB, driven by the real adb
server. See :class:`VirtualFarm` for the API tests use and ``farm virtual`` for the CLI.

Names are imported on first use: the sync worker (farm.virtual.syncd), which runs inside a device's
view for every push and pull, must not pay for adbutils and the manager."""

from __future__ import annotations

import importlib

_WHERE = {"Faults": "farm.virtual.faults", "SOC_PROFILES": "farm.virtual.identity",
          "VirtualDeviceSpec": "farm.virtual.identity", "VirtualDeviceProcess": "farm.virtual.manager",
          "VirtualDeviceStatus": "farm.virtual.manager", "VirtualFarm": "farm.virtual.manager"}

__all__ = ["SOC_PROFILES", "Faults", "VirtualDeviceProcess", "VirtualDeviceStatus", "VirtualDeviceSpec",
           "VirtualFarm"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'farm.virtual' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
