"""The conditions of a measurement on a device: what the phone was doing while a figure was taken.

One shell call reads them all (what a phone has, as a virtual device imitates it): ``dumpsys battery``
(level, temperature, charging), the thermal status of ``dumpsys thermalservice`` (Android's 0 NONE ..
6 SHUTDOWN), the deep idle state and the screen state of ``dumpsys deviceidle`` and the CPU
frequency governors of the cpufreq policies. A reading a device does not give is None, never a guess.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from farm.device.probe import parse_battery
from farm.errors import InfraError

log = logging.getLogger(__name__)

THROTTLING_STATUS = 2   # THROTTLING_MODERATE: the platform has started to slow the SoC
CHARGING = "2"          # BatteryManager.BATTERY_STATUS_CHARGING
_STATUS = re.compile(r"^\s*Thermal Status: (\d+)", re.M)
_BATTERY_STATUS = re.compile(r"^\s*status: (\d+)", re.M)

COMMAND = ("dumpsys battery; echo @@thermal; dumpsys thermalservice; echo @@idle; "
           "dumpsys deviceidle get deep; echo @@screen; dumpsys deviceidle get screen; echo @@governor; "
           "cat /sys/devices/system/cpu/cpufreq/policy*/scaling_governor 2>/dev/null")


@dataclass(frozen=True)
class Conditions:
    battery_level: int | None = None
    battery_temp_c: float | None = None
    charging: bool | None = None
    thermal_status: int | None = None
    idle: str | None = None          # deviceidle's deep state: IDLE while forced idle, ACTIVE otherwise
    governors: str | None = None     # the cpufreq policies' governors, e.g. "schedutil" or "performance,schedutil"
    screen_on: bool | None = None    # deviceidle's view of the screen: a lit screen costs the SoC power and heat

    @property
    def throttling(self) -> bool:
        return self.thermal_status is not None and self.thermal_status >= THROTTLING_STATUS

    def to_json(self) -> dict:
        return asdict(self)


def parse_conditions(text: str) -> Conditions:
    sections = {"battery": ""}
    name = "battery"
    for line in text.splitlines(keepends=True):
        if line.startswith("@@"):
            name = line[2:].strip()
            sections[name] = ""
        else:
            sections[name] = sections.get(name, "") + line
    level, temp = parse_battery(sections["battery"])
    status = _BATTERY_STATUS.search(sections["battery"])
    thermal = _STATUS.search(sections.get("thermal", ""))
    idle = sections.get("idle", "").strip().splitlines()
    governors = sorted({g.strip() for g in sections.get("governor", "").split() if g.strip()})
    screen = sections.get("screen", "").strip()
    return Conditions(level, temp, None if status is None else status.group(1) == CHARGING,
                      None if thermal is None else int(thermal.group(1)),
                      idle[0].strip() if idle and idle[0].strip().isalpha() else None,
                      ",".join(governors) or None,
                      {"true": True, "false": False}.get(screen))


def read_conditions(device, timeout: float = 30.0) -> Conditions:
    return parse_conditions(device.shell(COMMAND, timeout=timeout).out)


@contextlib.contextmanager
def forced_idle(device) -> Iterator[None]:
    """Deep idle forced for the block (``dumpsys deviceidle force-idle``: no background jobs, syncs
    or alarms while measuring), restored after, also when the block fails."""
    device.shell("dumpsys deviceidle force-idle deep", timeout=30)
    try:
        yield
    finally:
        try:
            device.shell("dumpsys deviceidle unforce", timeout=30)
        except InfraError as e:  # a device gone is the caller's error already; its next boot forgets
            log.warning("deviceidle unforce on %s: %s", device.serial, e)


CPUFREQ = "/sys/devices/system/cpu/cpufreq"
PINNED_GOVERNOR = "performance"


@contextlib.contextmanager
def pinned_governors(device, *, cpufreq: str = CPUFREQ) -> Iterator[str]:
    """The CPU frequency governors pinned to ``performance`` for the block where the device allows it
    (a root shell: ``adb root`` on a userdebug build), each policy's own restored after, also when the
    block fails; yields what was done, for the record. A user build's shell cannot write
    scaling_governor: nothing is changed and the record says so (its governors are read with the
    conditions of every run, so a figure taken under another policy shows it)."""
    q = shlex.quote(cpufreq)
    found = device.shell(f"id -u; for p in {q}/policy*; do [ -f \"$p/scaling_governor\" ] && "
                         f"echo \"$p $(cat \"$p/scaling_governor\") $(cat \"$p/scaling_available_governors\" "
                         f"2>/dev/null)\"; done", timeout=30).out.split("\n")
    uid = found[0].strip()
    policies = {}  # path -> its governor before
    for line in found[1:]:
        parts = line.split()
        if len(parts) >= 2 and PINNED_GOVERNOR in parts[2:]:
            policies[parts[0]] = parts[1]
    if uid != "0":
        yield f"not pinned: the shell is not root (uid {uid or '?'})"
        return
    if not policies:
        yield f"not pinned: no cpufreq policy offers {PINNED_GOVERNOR}"
        return

    def write(governors: dict[str, str]) -> bool:
        command = " && ".join(f"echo {shlex.quote(g)} > {shlex.quote(p + '/scaling_governor')}"
                              for p, g in governors.items())
        return device.shell(command, timeout=30).exit_code == 0

    if not write({p: PINNED_GOVERNOR for p in policies}):
        write(policies)  # those written before the refusal go back
        yield "not pinned: scaling_governor refused the write"
        return
    try:
        yield f"pinned {PINNED_GOVERNOR} ({len(policies)} policies)"
    finally:
        try:
            if not write(policies):
                log.warning("restoring the CPU governors of %s failed", device.serial)
        except InfraError as e:  # a device gone is the caller's error already; its next boot resets
            log.warning("restoring the CPU governors of %s: %s", device.serial, e)
