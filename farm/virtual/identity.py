"""Who a virtual device is: its properties per SoC, and the root directory that holds them.

The root directory R of a device (host side) holds its bookkeeping, outside the device's view:
``spec.json`` (properties, free space), ``phone.json`` (battery, thermals: farm.virtual.phone),
``faults.json``, ``run.json``, ``device.log``. The rest is what the view (farm.virtual.confine) is made
of: ``data/`` (``/data`` inside; the workspace is ``/data/local/tmp/ptefarm``, announced in
``ro.ptefarm.workspace``), ``system/`` (``/system``: build.prop and tiny imitations of getprop,
dumpsys, df, sha256sum), ``etc/`` and ``sys/class/``.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from farm.config import DEFAULT_WORKSPACE
from farm.errors import UsageError
from farm.fileio import write_atomic
from farm.soc import HTP_ARCH_BY_SOC, PLATFORM_BY_SOC
from farm.virtual.confine import ETC_REL, MEDIA_REL, PROPS_REL, SHELL_UID, STORAGE_REL, SYSTEM_REL
from farm.virtual.simphone import SIMULATED, TIMING_PROP, check_timing
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


# Build facts of a release (ro.build.id, security patch, build date), as phones of that release carry.
_BUILDS = {"13": ("TP1A.220624.014", "2023-02-01", 1675209600),
           "14": ("UP1A.231005.007", "2024-02-01", 1706745600),
           "15": ("AP3A.240905.015.A2", "2025-02-01", 1738368000),
           "16": ("BP2A.250605.031.A3", "2025-10-01", 1759276800)}
BUILD_TYPE = "userdebug"  # farm phones are userdebug (shell reads /data/tombstones, as here)


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
    timing: str = "host"  # "phone": its runner reports a simulated phone's timing (farm.virtual.simphone)

    def __post_init__(self) -> None:
        check_timing(self.timing, self.soc)

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
    brand = "samsung" if model.startswith("SM-") else "Xiaomi"
    build_id, patch, date_utc = _BUILDS.get(p.release, _BUILDS["14"])
    incremental = f"{model[3:]}XXU1AXB5" if model.startswith("SM-") else "V816.0.1.0"
    fingerprint = f"{brand}/{p.name}/{p.device}:{p.release}/{build_id}/{incremental}:{BUILD_TYPE}/release-keys"
    props = {
        "ro.board.platform": p.platform,
        "ro.boot.hardware": "qcom",
        "ro.boot.serialno": serialno,
        "ro.build.characteristics": "phone",
        "ro.build.date": time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime(date_utc)),
        "ro.build.date.utc": str(date_utc),
        "ro.build.display.id": f"{build_id}.{incremental}",
        "ro.build.fingerprint": fingerprint,
        "ro.build.flavor": f"{p.name}-{BUILD_TYPE}",
        "ro.build.id": build_id,
        "ro.build.product": p.device,
        "ro.build.tags": "release-keys",
        "ro.build.type": BUILD_TYPE,
        "ro.build.version.codename": "REL",
        "ro.build.version.incremental": incremental,
        "ro.build.version.release": p.release,
        "ro.build.version.sdk": str(p.sdk),
        "ro.build.version.security_patch": patch,
        "ro.debuggable": "1",
        "ro.hardware": "qcom",
        "ro.product.board": p.platform,
        "ro.product.brand": brand,
        "ro.product.cpu.abi": "arm64-v8a",
        "ro.product.cpu.abilist": "arm64-v8a,armeabi-v7a,armeabi",
        "ro.product.cpu.abilist32": "armeabi-v7a,armeabi",
        "ro.product.cpu.abilist64": "arm64-v8a",
        "ro.product.device": p.device,
        "ro.product.locale": "en-US",
        "ro.product.manufacturer": brand,
        "ro.product.model": model,
        "ro.product.name": p.name,
        "ro.product.vendor.brand": brand,
        "ro.product.vendor.device": p.device,
        "ro.product.vendor.manufacturer": brand,
        "ro.product.vendor.model": model,
        "ro.product.vendor.name": p.name,
        "ro.secure": "1",
        "ro.serialno": serialno,
        "ro.vendor.build.fingerprint": fingerprint,
        "ro.ptefarm.virtual": "1",
        **({TIMING_PROP: SIMULATED} if spec.timing == "phone" else {}),
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


RUNTIME_PROPS_FILE = "runtime.prop"  # what init sets while the device runs (sys.boot_completed, ...)
# Per-boot state the device's tools keep in /data (shell-writable there, as these overrides are on a
# phone): forgotten at every boot, as a phone forgets `dumpsys battery set` and `deviceidle force-idle`.
BOOT_STATE_GLOB = "data/system/ptefarm-*"


def device_shell() -> str:
    """``/system/bin/sh``: mksh, Android's shell (Debian package mksh), or the host's /bin/sh where
    mksh is missing (then scripts using ``[[ ]]`` fail, as the device log says)."""
    for candidate in ("/usr/bin/mksh", "/bin/mksh"):
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("mksh")
    return found or "/bin/sh"


def write_runtime_props(root: Path, props: dict[str, str]) -> None:
    """Replace the device's runtime properties (a reader sees the old set or the new one)."""
    path = root / PROPS_REL / RUNTIME_PROPS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(f"{k}={v}\n" for k, v in sorted(props.items())))


def install_system(root: Path, props: dict[str, str], free_bytes: int | None) -> None:
    """Write ``R/system`` (``/system`` inside: build.prop and the tools), ``R/etc`` (passwd, group,
    hosts) and the phone's sysfs files. Done at each start: the runner link follows the interpreter
    that runs the device, the workspace property its confinement."""
    system_bin = root / SYSTEM_REL / "bin"
    system_bin.mkdir(parents=True, exist_ok=True)
    write_atomic(root / SYSTEM_REL / "build.prop", "".join(f"{k}={v}\n" for k, v in props.items()))
    write_runtime_props(root, {})  # nothing of the last boot: the device sets what its boot sets
    for stale in root.glob(BOOT_STATE_GLOB):
        stale.unlink(missing_ok=True)
    _write_tool(system_bin / "getprop", GETPROP)
    _write_tool(system_bin / "dumpsys", DUMPSYS)
    python = shlex.quote(sys.executable)
    _write_tool(system_bin / "logcat", f'#!/bin/sh\nexec {python} -S -m farm.virtual.logcat logcat "$@"\n')
    _write_tool(system_bin / "log", f'#!/bin/sh\nexec {python} -S -m farm.virtual.logcat log "$@"\n')
    # toybox's sha256sum hashes with the CPU's SHA instructions (BoringSSL), the host's coreutils does not
    _write_tool(system_bin / "sha256sum", f'#!/bin/sh\nexec {python} -S -m farm.virtual.hashsum "$@"\n')
    if free_bytes is not None:
        _write_tool(system_bin / "df", DF.format(kib=free_bytes // 1024))
    else:
        (system_bin / "df").unlink(missing_ok=True)  # the real df reports the storage's filesystem
    # sh: Android's mksh, as seen inside; the runner: the venv's console script (bundles of dialect
    # host), watched by farm.virtual.runwrap (logcat lines, tombstones), the same pid for the caller.
    _link(system_bin / "sh", device_shell())
    runner = system_bin / "farm-llama-runner"
    if runner.is_symlink():
        runner.unlink()
    real = shlex.quote(str(Path(sys.executable).parent / "farm-llama-runner"))
    _write_tool(runner, f'#!/bin/sh\nexec {python} -S -m farm.virtual.runwrap --zygote {real} "$0" "$@"\n')
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
# getprop of a virtual device: the build's properties from /system/build.prop, what the device set at
# boot (sys.boot_completed, ...) from /dev/__properties__/runtime.prop. No argument lists them all,
# sorted, as '[key]: [value]'; 'getprop KEY [DEFAULT]' prints the value (DEFAULT or an empty line when
# unset).
props="${ANDROID_ROOT:-/system}/build.prop"
runtime="${PTEFARM_PROPS:-/dev/__properties__}/runtime.prop"
if [ $# -eq 0 ]; then
  cat "$props" "$runtime" 2>/dev/null | LC_ALL=C sort -t= -k1,1 -u \
    | sed -e 's/^\([^=]*\)=\(.*\)$/[\1]: [\2]/'
  exit 0
fi
for file in "$runtime" "$props"; do
  [ -r "$file" ] || continue
  while IFS= read -r line; do
    case "$line" in "$1="*) printf '%s\n' "${line#*=}"; exit 0;; esac
  done < "$file"
done
printf '%s\n' "${2:-}"
"""

DUMPSYS = r"""#!/bin/sh
# dumpsys of a virtual device: battery, deviceidle and thermalservice, in the shapes Android 14 prints.
# 'dumpsys battery' reads the battery's sysfs files as BatteryService does (temperature in tenths of a
# degree C); 'dumpsys battery set temp|level N' and 'reset' override what it reports, as on a phone
# (the sysfs files stay as they are). 'dumpsys deviceidle force-idle|unforce|get ...' keeps its state
# in /data/system until the next boot. 'dumpsys thermalservice' reads the thermal zones; each zone's
# status (0 NONE .. 6 SHUTDOWN) comes from its type's thresholds, the overall status is the highest.
sysfs="${PTEFARM_SYSFS:-/sys}/class"
state="${ANDROID_DATA:-/data}/system/ptefarm"
battery_status() {
  case "$(cat "$sysfs/power_supply/battery/status" 2>/dev/null)" in
    Charging) echo 2;; Discharging) echo 3;; "Not charging") echo 4;; Full) echo 5;; *) echo 1;;
  esac
}
case "$1" in
-l)
  printf 'Currently running services:\n  battery\n  deviceidle\n  thermalservice\n'
  ;;
battery)
  if [ "$2" = set ]; then
    case "$3" in
      temp|level) case "$4" in ""|*[!0-9]*) echo "Bad value: $4" >&2; exit 1;; esac
                  mkdir -p "${state%/*}" && printf %s "$4" > "$state-battery.$3"; exit 0;;
      *) echo "Unknown set option: $3" >&2; exit 1;;
    esac
  fi
  if [ "$2" = reset ]; then rm -f "$state-battery.temp" "$state-battery.level"; exit 0; fi
  temperature=$(cat "$state-battery.temp" 2>/dev/null || cat "$sysfs/power_supply/battery/temp" 2>/dev/null || echo 0)
  level=$(cat "$state-battery.level" 2>/dev/null || cat "$sysfs/power_supply/battery/capacity" 2>/dev/null || echo 0)
  status=$(battery_status)
  cat <<END
Current Battery Service state:
  AC powered: false
  USB powered: true
  Wireless powered: false
  Max charging current: 500000
  Max charging voltage: 5000000
  Charge counter: 4200000
  status: $status
  health: 2
  present: true
  level: $level
  scale: 100
  voltage: 4312
  temperature: $temperature
  technology: Li-ion
END
  ;;
deviceidle)
  forced=$(cat "$state-deviceidle" 2>/dev/null)
  charging=false; [ "$(battery_status)" = 2 ] && charging=true
  deep=ACTIVE; light=ACTIVE
  case "$forced" in deep) deep=IDLE; light=OVERRIDE;; light) light=IDLE;; esac
  case "$2" in
    force-idle)
      mode=${3:-deep}
      case "$mode" in deep|light) ;; *) echo "Unknown idle mode: $mode"; exit 0;; esac
      mkdir -p "${state%/*}" && printf %s "$mode" > "$state-deviceidle"
      echo "Now forced in to $mode idle mode";;
    unforce)
      rm -f "$state-deviceidle"
      echo "Light state: ACTIVE, deep state: ACTIVE";;
    get)
      case "$3" in
        deep) echo "$deep";; light) echo "$light";;
        force) if [ -n "$forced" ]; then echo true; else echo false; fi;;
        screen) echo true;; charging) echo "$charging";; network) echo true;;
        *) echo "Unknown get option: $3";;
      esac;;
    "")
      if [ -n "$forced" ]; then f=true; else f=false; fi
      cat <<END
  Settings:
  mLightEnabled=true  mDeepEnabled=true
  mForceIdle=$f
  mScreenOn=true
  mCharging=$charging
  mState=$deep mLightState=$light
END
      ;;
    *) echo "Unknown option: $2";;
  esac
  ;;
thermalservice)
  for zone in "$sysfs"/thermal/thermal_zone*; do
    [ -r "$zone/temp" ] && printf '%s %s\n' "$(cat "$zone/type")" "$(cat "$zone/temp")"
  done | awk -v battery="$(cat "$sysfs/power_supply/battery/temp" 2>/dev/null || echo 0)" '
    # Android Temperature types; status thresholds (LIGHT..SHUTDOWN, deg C) per type, as a
    # Snapdragon thermal HAL configures them.
    function kind(name) {
      if (name ~ /^cpu/) return 0; if (name ~ /^gpu/) return 1; if (name ~ /batt/) return 2
      if (name ~ /skin|therm/) return 3; if (name ~ /^(nsp|npu|cdsp)/) return 9; return -1
    }
    function status(type, t,    n, i, th) {
      if (type == 3) split("39 41 43 45 50 55", th, " ")
      else if (type == 2) split("42 44 46 48 55 60", th, " ")
      else if (type >= 0) split("85 90 95 100 105 115", th, " ")
      else return 0
      n = 0; for (i = 1; i <= 6; i++) if (t >= th[i] + 0) n = i
      return n
    }
    function value(t) { return (t == int(t)) ? sprintf("%.1f", t) : sprintf("%g", t) }
    function add(n, t) { count++; name[count] = n; temp[count] = t; type[count] = kind(n)
                         st[count] = status(type[count], t); if (st[count] > worst) worst = st[count] }
    NF == 2 { add($1, $2 / 1000) }
    function list(   i) {
      for (i = 1; i <= count; i++)
        printf "\tTemperature{mValue=%s, mType=%d, mName=%s, mStatus=%d}\n", value(temp[i]), type[i], name[i], st[i]
    }
    END {
      add("battery", battery / 10)
      print "IsStatusOverride: false"
      print "ThermalEventListeners:\n\tcallbacks: 1\n\tkilled: false\n\tbroadcasts count: -1"
      print "ThermalStatusListeners:\n\tcallbacks: 1\n\tkilled: false\n\tbroadcasts count: -1"
      print "Thermal Status: " (worst + 0)
      print "Cached temperatures:"
      list()
      print "HAL Ready: true"
      print "HAL connection:\n\tThermalHAL AIDL 1  connected: yes"
      print "Current temperatures from HAL:"
      list()
      print "Current cooling devices from HAL:"
      print "\tCoolingDevice{mValue=0, mType=2, mName=cpu-cluster0}"
      print "\tCoolingDevice{mValue=0, mType=2, mName=cpu-cluster1}"
    }'
  ;;
*)
  echo "Can't find service: $1" >&2; exit 1
  ;;
esac
"""

DF = """#!/bin/sh
# df of a virtual device with a fixed amount of free space (toybox 'df -k' layout).
echo "Filesystem     1K-blocks    Used Available Use% Mounted on"
echo "/dev/block/dm-48 {kib} 0 {kib} 0% /data"
"""
