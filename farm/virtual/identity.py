"""Who a virtual device is: its properties per SoC, and the root directory that holds them.

The root directory R of a device (host side) holds its bookkeeping, outside the device's view:
``spec.json`` (properties, free space), ``phone.json`` (battery, thermals: farm.virtual.phone),
``faults.json``, ``run.json``, ``device.log``. The rest is what the view (farm.virtual.confine) is made
of: ``data/`` (``/data`` inside; the workspace is ``/data/local/tmp/ptefarm``, announced in
``ro.ptefarm.workspace``), ``system/`` (``/system``: build.prop and tiny imitations of getprop,
dumpsys, df), ``etc/`` and ``sys/class/``.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from farm.config import DEFAULT_WORKSPACE
from farm.errors import UsageError
from farm.fileio import write_atomic
from farm.soc import HTP_ARCH_BY_SOC, PLATFORM_BY_SOC
from farm.virtual.confine import ETC_REL, MEDIA_REL, SHELL_UID, STORAGE_REL, SYSTEM_REL
from farm.virtual.phone import PHONE_FILE, PhoneState, load_phone, render_sysfs, save_phone

SPEC_FILE = "spec.json"
# The workspace relative to /data (the config's default workspace is under /data/local/tmp).
WORKSPACE_IN_DATA = DEFAULT_WORKSPACE.removeprefix("/data/")


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


def make_identity(spec: VirtualDeviceSpec) -> DeviceIdentity:
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
    }
    if not spec.platform_only:
        props["ro.soc.model"] = p.soc
        props["ro.soc.manufacturer"] = "QTI"
    return DeviceIdentity(props=dict(sorted(props.items())), free_bytes=spec.free_bytes)


def create_device_root(root: Path, identity: DeviceIdentity) -> None:
    """Lay out a device root: its spec, its storage (``/data`` inside) and its phone state.
    Idempotent. What depends on how the device runs (confined or not) is written at each start by
    :func:`install_system`."""
    host_workspace(root).mkdir(parents=True, exist_ok=True)
    (root / MEDIA_REL).mkdir(parents=True, exist_ok=True)
    write_atomic(root / SPEC_FILE, json.dumps({"props": identity.props,
                                               "free_bytes": identity.free_bytes}, indent=1))
    if not (root / PHONE_FILE).exists():
        save_phone(root, PhoneState(battery_level=identity.battery_level,
                                    battery_temp_c=identity.battery_temperature_tenths / 10))


def load_identity(root: Path) -> DeviceIdentity:
    try:
        raw = json.loads((root / SPEC_FILE).read_text())
        return DeviceIdentity(props=raw["props"], free_bytes=raw.get("free_bytes"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{root / SPEC_FILE}: not a virtual device spec: {e}") from None


def host_workspace(root: Path) -> Path:
    return root / STORAGE_REL / WORKSPACE_IN_DATA


def runtime_props(identity: DeviceIdentity, root: Path, confined: bool) -> dict[str, str]:
    """The properties a running device announces: its identity, where its workspace is (a host path
    when unconfined: its commands then see the host) and whether it is confined."""
    workspace = DEFAULT_WORKSPACE if confined else str(host_workspace(root))
    return dict(sorted({**identity.props, "ro.ptefarm.workspace": workspace,
                        "ro.ptefarm.confined": "1" if confined else "0"}.items()))


def install_system(root: Path, props: dict[str, str], free_bytes: int | None) -> None:
    """Write ``R/system`` (``/system`` inside: build.prop and the tools), ``R/etc`` (passwd, group,
    hosts) and the phone's sysfs files. Done at each start: the runner link follows the interpreter
    that runs the device, the workspace property its confinement."""
    system_bin = root / SYSTEM_REL / "bin"
    system_bin.mkdir(parents=True, exist_ok=True)
    write_atomic(root / SYSTEM_REL / "build.prop", "".join(f"{k}={v}\n" for k, v in props.items()))
    _write_tool(system_bin / "getprop", GETPROP)
    _write_tool(system_bin / "dumpsys", DUMPSYS)
    if free_bytes is not None:
        _write_tool(system_bin / "df", DF.format(kib=free_bytes // 1024))
    else:
        (system_bin / "df").unlink(missing_ok=True)  # the real df reports the storage's filesystem
    # sh: the host's, as seen inside; the runner: the venv's console script (bundles of dialect host).
    _link(system_bin / "sh", "/bin/sh")
    _link(system_bin / "farm-llama-runner", str(Path(sys.executable).parent / "farm-llama-runner"))
    etc = root / ETC_REL
    etc.mkdir(exist_ok=True)
    write_atomic(etc / "passwd", "root:x:0:0:root:/:/system/bin/sh\n"
                                 f"shell:x:{SHELL_UID}:{SHELL_UID}:shell:/:/system/bin/sh\n")
    write_atomic(etc / "group", f"root:x:0:\nshell:x:{SHELL_UID}:\n")
    write_atomic(etc / "hosts", "127.0.0.1 localhost\n::1 localhost ip6-localhost\n")
    (root / STORAGE_REL / "local" / "tmp").mkdir(parents=True, exist_ok=True)
    (root / MEDIA_REL).mkdir(parents=True, exist_ok=True)
    render_sysfs(root, load_phone(root))


def _link(path: Path, target: str) -> None:
    if path.is_symlink() and os.readlink(path) == target:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, path)


def _write_tool(path: Path, text: str) -> None:
    write_atomic(path, text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


# Imitations of Android tools, kept tiny: only what the farm reads. Their paths default to the view's
# (/system, /sys, /data); an unconfined device points them into its root with the same variables.
GETPROP = r"""#!/bin/sh
# getprop of a virtual device: no argument lists '[key]: [value]', one argument prints its value.
props="${ANDROID_ROOT:-/system}/build.prop"
if [ $# -eq 0 ]; then
  sed -e 's/^\([^=]*\)=\(.*\)$/[\1]: [\2]/' "$props"
else
  while IFS= read -r line; do
    case "$line" in "$1="*) printf '%s\n' "${line#*=}"; exit 0;; esac
  done < "$props"
  echo
fi
"""

DUMPSYS = r"""#!/bin/sh
# dumpsys of a virtual device: only 'dumpsys battery', read from the battery's sysfs files as
# BatteryService does (temperature in tenths of a degree C). 'dumpsys battery set temp|level N' and
# 'dumpsys battery reset' override what it reports, as on a phone (the sysfs files stay as they are).
if [ "$1" != battery ]; then echo "Can't find service: $1" >&2; exit 1; fi
sysfs="${PTEFARM_SYSFS:-/sys}/class/power_supply/battery"
state="${ANDROID_DATA:-/data}/system/ptefarm-battery"
if [ "$2" = set ]; then
  case "$3" in
    temp|level) case "$4" in ""|*[!0-9]*) echo "Bad value: $4" >&2; exit 1;; esac
                mkdir -p "${state%/*}" && printf %s "$4" > "$state.$3"; exit 0;;
    *) echo "Unknown set option: $3" >&2; exit 1;;
  esac
fi
if [ "$2" = reset ]; then rm -f "$state.temp" "$state.level"; exit 0; fi
temperature=$(cat "$state.temp" 2>/dev/null || cat "$sysfs/temp" 2>/dev/null || echo 0)
level=$(cat "$state.level" 2>/dev/null || cat "$sysfs/capacity" 2>/dev/null || echo 0)
case "$(cat "$sysfs/status" 2>/dev/null)" in
  Charging) status=2;; Discharging) status=3;; "Not charging") status=4;; Full) status=5;; *) status=1;;
esac
cat <<EOF
Current Battery Service state:
  AC powered: false
  USB powered: true
  Wireless powered: false
  Max charging current: 500000
  status: $status
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
