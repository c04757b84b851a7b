"""Who a virtual device is: its properties per SoC, and the root directory that holds them.

The root directory R of a device contains ``spec.json`` (its properties and free space), ``bin/``
(tiny imitations of Android's getprop, dumpsys and df) and ``data/local/tmp/ptefarm``, the workspace,
which the device announces as a host path in ``ro.ptefarm.workspace`` since its commands run on the host.
"""

from __future__ import annotations

import json
import secrets
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path

from farm.errors import UsageError
from farm.fileio import write_atomic
from farm.soc import HTP_ARCH_BY_SOC, PLATFORM_BY_SOC

SPEC_FILE = "spec.json"
WORKSPACE_REL = "data/local/tmp/ptefarm"


@dataclass(frozen=True)
class SocProfile:
    """A typical phone with a SoC of farm.soc's table, which gives its codename and HTP arch."""

    soc: str            # ro.soc.model
    model: str          # ro.product.model of a typical phone with that SoC
    name: str           # ro.product.name
    device: str         # ro.product.device
    release: str        # ro.build.version.release
    sdk: int            # ro.build.version.sdk

    @property
    def platform(self) -> str:
        """ro.board.platform (Qualcomm's code name), from farm.soc."""
        return PLATFORM_BY_SOC[self.soc]

    @property
    def htp_arch(self) -> str:
        return HTP_ARCH_BY_SOC[self.soc]


def _profiles(*phones: SocProfile) -> dict[str, SocProfile]:
    """The profiles by SoC, each checked against farm.soc: a virtual device of a SoC the farm cannot
    map to an HTP arch (or that has no codename for ``platform_only``) would test nothing real."""
    for p in phones:
        if p.soc not in HTP_ARCH_BY_SOC or p.soc not in PLATFORM_BY_SOC:
            raise ValueError(f"virtual SoC profile {p.soc}: not in farm.soc's tables (HTP arch and "
                             f"ro.board.platform codename)")
    return {p.soc: p for p in phones}


# No SM8635 (8s Gen 3, "cliffs"): upstream's QcomChipset has no entry for it, so it has no HTP arch.
SOC_PROFILES: dict[str, SocProfile] = _profiles(
    SocProfile("SM8450", "SM-S908B", "b0sxxx", "b0s", "13", 33),        # 8 Gen 1, S22 Ultra
    SocProfile("SM8475", "SM-F936B", "q4qxxx", "q4q", "13", 33),        # 8+ Gen 1, Z Fold4
    SocProfile("SM8550", "SM-S918B", "dm3qxxx", "dm3q", "14", 34),      # 8 Gen 2, S23 Ultra
    SocProfile("SM8650", "SM-S928B", "e3qxxx", "e3q", "14", 34),        # 8 Gen 3, S24 Ultra
    SocProfile("SM8750", "SM-S938B", "pa3qxxx", "pa3q", "15", 35),      # 8 Elite, S25 Ultra
    SocProfile("SM8850", "SM-S948B", "pa4qxxx", "pa4q", "16", 36),      # 8 Elite Gen 5
)


@dataclass(frozen=True)
class VirtualDeviceSpec:
    """What to start. ``platform_only``: omit ro.soc.model (old builds only have ro.board.platform).
    ``free_bytes``: space reported by ``df`` on the workspace, and the largest file a push may write."""

    soc: str = "SM8650"
    serial_hint: str | None = None
    platform_only: bool = False
    model: str | None = None
    free_bytes: int | None = None

    def profile(self) -> SocProfile:
        try:
            return SOC_PROFILES[self.soc]
        except KeyError:
            raise UsageError(f"unknown SoC '{self.soc}' for a virtual device "
                             f"(known: {', '.join(sorted(SOC_PROFILES))})") from None


@dataclass(frozen=True)
class DeviceIdentity:
    """What a virtual device announces about itself (its system properties, free space, battery),
    stored in its root. Internal to farm.virtual: the farm learns it through adb, as a
    farm.devices.DeviceInfo, like a phone's."""

    props: dict[str, str]
    free_bytes: int | None
    battery_level: int = 87
    battery_temperature_tenths: int = 312

    @property
    def serialno(self) -> str:
        return self.props["ro.serialno"]


def make_identity(spec: VirtualDeviceSpec, root: Path) -> DeviceIdentity:
    p = spec.profile()
    model = spec.model or p.model
    serialno = spec.serial_hint or f"V{p.soc[2:]}{secrets.token_hex(4).upper()}"
    for what, value in (("model", model), ("serial_hint", serialno)):
        if not value or any(c in value for c in ":;=\n\r\0") or len(value) > 64:
            raise UsageError(f"virtual device {what} {value!r} must be 1-64 chars without : ; =")
    if spec.free_bytes is not None and spec.free_bytes < 0:
        raise UsageError(f"virtual device free_bytes must be >= 0, got {spec.free_bytes}")
    props = {
        "ro.board.platform": p.platform,
        "ro.product.model": model,
        "ro.product.name": p.name,
        "ro.product.device": p.device,
        "ro.product.manufacturer": "samsung" if model.startswith("SM-") else "Xiaomi",
        "ro.build.version.release": p.release,
        "ro.build.version.sdk": str(p.sdk),
        "ro.product.cpu.abi": "arm64-v8a",
        "ro.serialno": serialno,
        "ro.ptefarm.virtual": "1",
        "ro.ptefarm.workspace": str(root / WORKSPACE_REL),
    }
    if not spec.platform_only:
        props["ro.soc.model"] = p.soc
        props["ro.soc.manufacturer"] = "QTI"
    return DeviceIdentity(props=dict(sorted(props.items())), free_bytes=spec.free_bytes)


def create_device_root(root: Path, identity: DeviceIdentity) -> None:
    """Lay out a device root: spec, tools and workspace. Idempotent."""
    (root / WORKSPACE_REL).mkdir(parents=True, exist_ok=True)
    (root / "bin").mkdir(exist_ok=True)
    write_atomic(root / SPEC_FILE, json.dumps({
        "props": identity.props,
        "free_bytes": identity.free_bytes,
        "battery_level": identity.battery_level,
        "battery_temperature_tenths": identity.battery_temperature_tenths,
    }, indent=1))
    props_file = root / "build.prop"
    write_atomic(props_file, "".join(f"{k}={v}\n" for k, v in identity.props.items()))
    _write_tool(root / "bin" / "getprop", GETPROP.format(props=shlex.quote(str(props_file))))
    _write_tool(root / "bin" / "dumpsys", DUMPSYS.format(
        level=identity.battery_level, temperature=identity.battery_temperature_tenths,
        state=shlex.quote(str(root / "battery"))))
    if identity.free_bytes is not None:
        _write_tool(root / "bin" / "df", DF.format(kib=identity.free_bytes // 1024))


def load_identity(root: Path) -> DeviceIdentity:
    try:
        raw = json.loads((root / SPEC_FILE).read_text())
        return DeviceIdentity(props=raw["props"], free_bytes=raw.get("free_bytes"),
                              battery_level=raw.get("battery_level", 87),
                              battery_temperature_tenths=raw.get("battery_temperature_tenths", 312))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{root / SPEC_FILE}: not a virtual device spec: {e}") from None


def _write_tool(path: Path, text: str) -> None:
    write_atomic(path, text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


# Imitations of Android tools, kept tiny: only what the farm reads.
GETPROP = """#!/bin/sh
# getprop of a virtual device: no argument lists '[key]: [value]', one argument prints its value.
if [ $# -eq 0 ]; then
  sed -e 's/^\\([^=]*\\)=\\(.*\\)$/[\\1]: [\\2]/' {props}
else
  awk -v k="$1" 'index($0, k "=") == 1 {{ print substr($0, length(k) + 2); found = 1; exit }}
                END {{ if (!found) print "" }}' {props}
fi
"""

DUMPSYS = """#!/bin/sh
# dumpsys of a virtual device: only 'dumpsys battery' (temperature in tenths of a degree C), with
# Android's 'dumpsys battery set temp|level N' and 'dumpsys battery reset' to simulate a hot phone.
if [ "$1" != battery ]; then echo "Can't find service: $1" >&2; exit 1; fi
state={state}
if [ "$2" = set ]; then
  case "$3" in
    temp|level) case "$4" in ""|*[!0-9]*) echo "Bad value: $4" >&2; exit 1;; esac
                printf %s "$4" > "$state.$3"; exit 0;;
    *) echo "Unknown set option: $3" >&2; exit 1;;
  esac
fi
if [ "$2" = reset ]; then rm -f "$state.temp" "$state.level"; exit 0; fi
temperature=$(cat "$state.temp" 2>/dev/null || echo {temperature})
level=$(cat "$state.level" 2>/dev/null || echo {level})
cat <<EOF
Current Battery Service state:
  AC powered: false
  USB powered: true
  Wireless powered: false
  Max charging current: 500000
  status: 2
  health: 2
  present: true
  level: $level
  scale: 100
  voltage: 4312
  temperature: $temperature
  technology: Li-ion
EOF
"""

DF = """#!/bin/sh
# df of a virtual device with a fixed amount of free space (toybox 'df -k' layout).
echo "Filesystem     1K-blocks    Used Available Use% Mounted on"
echo "/dev/block/dm-48 {kib} 0 {kib} 0% /data"
"""
