"""Virtual Snapdragon devices: processes speaking the device side of ADB, driven by the real adb
server. See :class:`VirtualFarm` for the API tests use and ``farm virtual`` for the CLI."""

from farm.virtual.faults import Faults
from farm.virtual.identity import SOC_PROFILES, VirtualDeviceSpec
from farm.virtual.manager import VirtualDeviceProcess, VirtualDeviceStatus, VirtualFarm

__all__ = ["SOC_PROFILES", "Faults", "VirtualDeviceProcess", "VirtualDeviceSpec", "VirtualDeviceStatus",
           "VirtualFarm"]
