"""What a device is: its system properties, SoC and HTP arch, workspace, free space, battery, thermals.

:class:`Device` is a :class:`~farm.device.transport.DeviceTransport` that also knows its properties
(one shell call, cached) and can describe itself as a :class:`DeviceInfo` (one more shell call, whose
sections the parsers below read).
"""

from __future__ import annotations

import logging
import posixpath
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from farm.config import DEFAULT_WORKSPACE, AdbServerAddress
from farm.device.adb_server import FarmAdbClient
from farm.device.fence import FENCE_NAME
from farm.device.transport import DeviceTransport
from farm.soc import htp_arch, soc_from_props

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 20.0

PROPS = (
    "ro.soc.model", "ro.soc.manufacturer", "ro.board.platform", "ro.product.model",
    "ro.build.version.release", "ro.build.version.sdk", "ro.product.cpu.abi",
    "ro.ptefarm.virtual", "ro.ptefarm.workspace", "ro.ptefarm.confined", "ro.ptefarm.timing",
)

# One shell call for everything but the properties; sections start with "@@name".
_PROBE = ("mkdir -p {q} 2>/dev/null; echo @@fence; cat {fence} 2>/dev/null; echo; "
          "echo @@df; df -k {q} 2>/dev/null; "
          "echo @@battery; dumpsys battery 2>/dev/null; echo @@thermal; "
          "for z in /sys/class/thermal/thermal_zone*; do "
          "[ -r \"$z/temp\" ] && echo \"${{z##*/}}=$(cat \"$z/type\" 2>/dev/null)="
          "$(cat \"$z/temp\" 2>/dev/null)\"; done; true")


@dataclass
class DeviceInfo:
    """What discovery learnt of one device: the record that goes from discovery to the pool
    (``Pool.sync``), to ``farm devices`` and to the reports. ``state`` is adb's ("device" when usable);
    ``error`` says why a listed device could not be probed."""

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
    confined: bool | None = None  # a virtual device: False when it runs unconfined (degraded mode)
    workspace: str | None = None
    free_bytes: int | None = None
    battery_level: int | None = None
    battery_temp_c: float | None = None
    thermal: dict[str, float] = field(default_factory=dict)
    tags: tuple[str, ...] = ()  # labels the pool matches lease requests against (e.g. "usb3")
    error: str | None = None
    # The lease token the device's fence names (farm.device.fence), for the pool alone: a pool that
    # never granted it holds the device back (farm.pool.health). Never shown: a token is a secret.
    fence: str | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        shown = asdict(self)
        del shown["fence"]
        return shown


class Device(DeviceTransport):
    """One device (``state == "device"``) on one adb server."""

    def __init__(self, client: FarmAdbClient, serial: str, server: AdbServerAddress, *,
                 workspace_root: str = DEFAULT_WORKSPACE):
        super().__init__(client, serial, server)
        self.workspace_root = workspace_root
        self._props: dict[str, str] | None = None

    def __repr__(self) -> str:
        return f"Device({self.serial!r} on {self.server})"

    def props(self, *, refresh: bool = False) -> dict[str, str]:
        """The system properties the farm uses (one shell call, cached)."""
        if self._props is None or refresh:
            script = "; ".join(f"printf '%s=%s\\n' {p} \"$(getprop {p})\"" for p in PROPS)
            self._props = parse_props(self.shell(script, timeout=PROBE_TIMEOUT_S, check=True).out)
        return self._props

    @property
    def is_virtual(self) -> bool:
        return self.props().get("ro.ptefarm.virtual") == "1"

    @property
    def confined(self) -> bool | None:
        """For a virtual device: whether its commands run in its own Android view (False: degraded
        mode, on the host). None for a phone."""
        if not self.is_virtual:
            return None
        return self.props().get("ro.ptefarm.confined") != "0"

    @property
    def workspace(self) -> str:
        """The farm's workspace on this device; a virtual device names its own (an Android path, or a
        host path when it runs unconfined)."""
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
        probe = _PROBE.format(q=shlex.quote(ws), fence=shlex.quote(posixpath.join(ws, FENCE_NAME)))
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
            virtual=self.is_virtual, confined=self.confined, workspace=ws, free_bytes=parse_df(sections.get("df", "")),
            battery_level=battery[0], battery_temp_c=battery[1],
            thermal=parse_thermal(sections.get("thermal", "")),
            fence=sections.get("fence", "").strip() or None)


# -- parsers ----------------------------------------------------------------------------------------

def parse_props(text: str) -> dict[str, str]:
    """``key=value`` lines of the properties in :data:`PROPS` (others are ignored)."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in PROPS:
            props[key] = value.strip()
    return props


def split_sections(output: str) -> dict[str, str]:
    """``@@name`` sections of a probe's output. Split on newlines only: a file name in it may hold
    U+2028 or other characters ``str.splitlines`` would split on."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.split("\n"):
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
            log.warning("thermal zone %s: unreadable temperature %r", zone, raw)
            continue
        name = kind or zone
        if name in zones:
            name = f"{name}#{zone.removeprefix('thermal_zone')}"
        zones[name] = value / 1000.0 if abs(value) >= 1000 else value
    return zones
