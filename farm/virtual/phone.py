"""Phone state of a virtual device: battery level, battery temperature and thermal zones.

The state lives in ``R/phone.json`` (written atomically); every change renders the sysfs files a phone
has, each atomically, under ``R/sys/class`` (bound over ``/sys/class`` inside the device's view):

    thermal/thermal_zoneN/{type,temp}               temp in millidegrees C, like Linux
    power_supply/battery/{capacity,temp,status,...} temp in tenths of a degree C, like Android

``dumpsys battery`` reads those, as Android's BatteryService does; ``dumpsys battery set temp|level N``
only overrides what dumpsys reports (as on a phone), until ``dumpsys battery reset``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from farm.errors import UsageError
from farm.fileio import write_atomic

PHONE_FILE = "phone.json"
SYS_CLASS_REL = "sys/class"
BATTERY_STATUSES = ("Unknown", "Charging", "Discharging", "Not charging", "Full")
_ZONE_TYPE = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")


@dataclass(frozen=True)
class ThermalZone:
    type: str      # e.g. "cpu-1-0", "nsphvx-0" (the HTP), as Qualcomm kernels name them
    temp_c: float


# Zones a Snapdragon phone reports, with room-temperature idle readings.
DEFAULT_ZONES = (ThermalZone("cpu-0-0", 36.0), ThermalZone("cpu-1-0", 37.5), ThermalZone("gpuss-0", 35.0),
                 ThermalZone("nsphvx-0", 35.5), ThermalZone("skin-therm", 31.0))


@dataclass(frozen=True)
class PhoneState:
    battery_level: int = 87            # %
    battery_temp_c: float = 31.2       # deg C
    battery_status: str = "Charging"   # USB-powered, as on a farm
    thermal: tuple[ThermalZone, ...] = field(default=DEFAULT_ZONES)

    def __post_init__(self) -> None:
        if isinstance(self.battery_level, bool) or not isinstance(self.battery_level, int) \
                or not 0 <= self.battery_level <= 100:
            raise UsageError(f"battery level must be an integer 0-100, got {self.battery_level!r}")
        for what, value in [("battery temperature", self.battery_temp_c)] + \
                [(f"thermal zone {z.type}", z.temp_c) for z in self.thermal]:
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or not -50 <= value <= 200:
                raise UsageError(f"{what}: temperature must be a number of deg C in -50..200, "
                                 f"got {value!r}")
        if self.battery_status not in BATTERY_STATUSES:
            raise UsageError(f"battery status must be one of {', '.join(BATTERY_STATUSES)}, "
                             f"got {self.battery_status!r}")
        for z in self.thermal:
            if not _ZONE_TYPE.match(z.type):
                raise UsageError(f"thermal zone type {z.type!r}: 1-64 letters, digits, '._+-'")

    def with_zone(self, zone: str, temp_c: float) -> PhoneState:
        """The state with one zone set; ``zone`` is its type (``cpu-1-0``), ``thermal_zoneN`` or N.
        A new type is added as the next zone."""
        zones = list(self.thermal)
        index = _zone_index(zone, zones)
        if index is None:
            zones.append(ThermalZone(zone, temp_c))
        else:
            zones[index] = replace(zones[index], temp_c=temp_c)
        return replace(self, thermal=tuple(zones))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict, where: str) -> PhoneState:
        try:
            zones = tuple(ThermalZone(str(z["type"]), z["temp_c"]) for z in raw.get("thermal", []))
            return cls(battery_level=raw.get("battery_level", 87),
                       battery_temp_c=raw.get("battery_temp_c", 31.2),
                       battery_status=raw.get("battery_status", "Charging"), thermal=zones)
        except (KeyError, TypeError, AttributeError) as e:
            raise UsageError(f"{where}: not a phone state: {e}") from None
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None


def _zone_index(zone: str, zones: list[ThermalZone]) -> int | None:
    number = zone.removeprefix("thermal_zone")
    if number.isdigit():
        if int(number) >= len(zones):
            raise UsageError(f"no thermal zone {zone} (zones: 0-{len(zones) - 1}; name a type to add one)")
        return int(number)
    for i, z in enumerate(zones):
        if z.type == zone:
            return i
    return None


def load_phone(root: Path) -> PhoneState:
    path = root / PHONE_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return PhoneState()
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: unreadable phone state: {e}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: not a phone state (a JSON object expected)")
    return PhoneState.from_json(raw, str(path))


def save_phone(root: Path, state: PhoneState) -> None:
    """Store the state and render its sysfs files (a reader sees the old value or the new one)."""
    write_atomic(root / PHONE_FILE, json.dumps(state.to_json(), indent=1))
    render_sysfs(root, state)


def render_sysfs(root: Path, state: PhoneState) -> None:
    base = root / SYS_CLASS_REL
    battery = base / "power_supply" / "battery"
    battery.mkdir(parents=True, exist_ok=True)
    for name, value in (("type", "Battery"), ("present", "1"), ("capacity", str(state.battery_level)),
                        ("temp", str(round(state.battery_temp_c * 10))),
                        ("status", state.battery_status), ("health", "Good"),
                        ("technology", "Li-ion"), ("voltage_now", "4312000")):
        _put(battery / name, value)
    thermal = base / "thermal"
    thermal.mkdir(parents=True, exist_ok=True)
    for i, zone in enumerate(state.thermal):
        d = thermal / f"thermal_zone{i}"
        d.mkdir(exist_ok=True)
        _put(d / "type", zone.type)
        _put(d / "temp", str(round(zone.temp_c * 1000)))
    for stale in thermal.glob("thermal_zone*"):  # zones dropped from the state
        n = stale.name.removeprefix("thermal_zone")
        if n.isdigit() and int(n) >= len(state.thermal):
            for f in stale.iterdir():
                f.unlink()
            stale.rmdir()


def _put(path: Path, value: str) -> None:
    if not path.exists() or path.read_text() != value + "\n":
        write_atomic(path, value + "\n")
