"""A virtual device answers phone scripts as a phone does: /system/bin/sh is mksh (upstream's emulator
wait loop runs), getprop reports what a Snapdragon phone reports, and dumpsys deviceidle, battery and
thermalservice print Android's shapes."""

from __future__ import annotations

import hashlib
import re

import pytest

from farm.virtual import VirtualDeviceSpec

# upstream's wait for an emulator's boot (executorch .ci/scripts), unchanged.
WAIT_LOOP = "while [[ -z $(getprop sys.boot_completed) ]]; do sleep 1; done"


@pytest.fixture
def device(shared_virtual_farm):
    return shared_virtual_farm.client().device(shared_virtual_farm.devices[0].serial)


def _sh(device, command: str):
    return device.shell2(command, v2=True, timeout=60)


def test_system_sh_is_mksh_with_ksh_syntax(device):
    r = _sh(device, 'echo "$KSH_VERSION"; x=abc; [[ $x == a* && -n $x ]] && echo match; '
                    'typeset -i n=6*7; echo $n; print -r -- done')
    assert r.returncode == 0, r.stderr
    version, match, n, done = r.stdout.splitlines()
    assert version.startswith("@(#)MIRBSD KSH") and match == "match" and n == "42" and done == "done"
    assert r.stderr == ""


def test_upstream_emulator_wait_loop_ends_once_booted(device):
    r = _sh(device, f"{WAIT_LOOP}; echo booted=$(getprop sys.boot_completed)")
    assert (r.returncode, r.stdout, r.stderr) == (0, "booted=1\n", "")


def test_wait_loop_waits_through_a_slow_boot(virtual_farm):
    """While the device boots, sys.boot_completed is empty: the loop goes round until it is set."""
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    virtual_farm.set_faults(dev.serial, boot_completed_delay_ms=4000)
    virtual_farm.reboot(dev.serial)
    adb = virtual_farm.client().device(dev.serial)
    r = adb.shell2(f"n=0; while [[ -z $(getprop sys.boot_completed) ]]; do n=$((n+1)); sleep 1; done; "
                   f"echo $n $(getprop sys.boot_completed)", v2=True, timeout=60)
    rounds, value = r.stdout.split()
    assert r.returncode == 0 and r.stderr == "" and value == "1"
    assert int(rounds) >= 1  # it saw the boot in progress
    virtual_farm.clear_faults(dev.serial)


def test_getprop_lists_a_phones_properties(device, shared_virtual_farm):
    listing = _sh(device, "getprop").stdout.splitlines()
    props = {}
    for line in listing:
        m = re.fullmatch(r"\[([^\]]+)\]: \[(.*)\]", line)
        assert m, line
        props[m[1]] = m[2]
    assert list(props) == sorted(props)
    dev = shared_virtual_farm.devices[0]
    assert props["sys.boot_completed"] == "1"
    assert props["ro.soc.model"] == "SM8650" and props["ro.board.platform"] == "pineapple"
    assert props["ro.hardware"] == "qcom" and props["ro.serialno"] == dev.serialno
    assert props["ro.build.version.sdk"] == "34" and props["ro.build.version.release"] == "14"
    assert props["ro.product.model"] == "SM-S928B" and props["ro.product.brand"] == "samsung"
    brand, name, rest = props["ro.build.fingerprint"].split("/", 2)
    assert (brand, name) == ("samsung", props["ro.product.name"])
    assert rest.startswith(f"{props['ro.product.device']}:14/{props['ro.build.id']}/"
                           f"{props['ro.build.version.incremental']}:{props['ro.build.type']}/")
    for key in ("ro.product.cpu.abilist", "ro.build.version.security_patch", "ro.build.date.utc",
                "ro.product.manufacturer", "ro.product.device", "ro.boot.hardware"):
        assert props[key], key
    # one property, a default for a missing one, an empty line for a missing one without
    r = _sh(device, "getprop ro.soc.model; getprop no.such.prop fallback; getprop no.such.prop; echo end")
    assert r.stdout == "SM8650\nfallback\n\nend\n"


def test_platform_only_device_reports_no_soc_model(shared_virtual_farm):
    other = shared_virtual_farm.client().device(shared_virtual_farm.devices[1].serial)
    r = _sh(other, "getprop ro.soc.model; getprop ro.board.platform")
    assert r.stdout == "\nkalama\n"


def test_deviceidle_force_idle_and_unforce(device):
    assert _sh(device, "dumpsys deviceidle get deep").stdout == "ACTIVE\n"
    forced = _sh(device, "dumpsys deviceidle force-idle")
    assert (forced.returncode, forced.stdout) == (0, "Now forced in to deep idle mode\n")
    assert _sh(device, "dumpsys deviceidle get deep; dumpsys deviceidle get force").stdout == \
        "IDLE\ntrue\n"
    assert "mForceIdle=true" in _sh(device, "dumpsys deviceidle").stdout
    unforced = _sh(device, "dumpsys deviceidle unforce")
    assert unforced.stdout == "Light state: ACTIVE, deep state: ACTIVE\n"
    assert _sh(device, "dumpsys deviceidle get deep").stdout == "ACTIVE\n"


def test_deviceidle_is_forgotten_at_reboot(virtual_farm):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8550")])
    adb = virtual_farm.client().device(dev.serial)
    adb.shell2("dumpsys deviceidle force-idle", v2=True, timeout=30)
    virtual_farm.reboot(dev.serial)
    adb = virtual_farm.client().device(dev.serial)
    assert adb.shell2("dumpsys deviceidle get deep", v2=True, timeout=30).stdout == "ACTIVE\n"


def _battery(text: str) -> dict[str, str]:
    lines = text.splitlines()
    assert lines[0] == "Current Battery Service state:"
    fields = {}
    for line in lines[1:]:
        key, sep, value = line.strip().partition(": ")
        assert line.startswith("  ") and sep, line
        fields[key] = value
    return fields


def test_dumpsys_battery_parses(device):
    fields = _battery(_sh(device, "dumpsys battery").stdout)
    assert fields["USB powered"] == "true" and fields["status"] == "2" and fields["present"] == "true"
    assert 0 <= int(fields["level"]) <= 100 and int(fields["temperature"]) > 0
    assert fields["scale"] == "100"


TEMPERATURE = re.compile(r"\tTemperature\{mValue=(-?[\d.]+), mType=(-?\d+), mName=([^,]+), "
                         r"mStatus=(\d)\}")


def _thermal(text: str) -> tuple[int, dict[str, tuple[float, int, int]]]:
    lines = text.splitlines()
    status = int(next(line for line in lines if line.startswith("Thermal Status: ")).split(": ")[1])
    start = lines.index("Current temperatures from HAL:") + 1
    temps = {}
    for line in lines[start:]:
        m = TEMPERATURE.fullmatch(line)
        if not m:
            break
        temps[m[3]] = (float(m[1]), int(m[2]), int(m[4]))
    return status, temps


def test_dumpsys_thermalservice_status_follows_the_zones(virtual_farm):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    adb = virtual_farm.client().device(dev.serial)
    status, temps = _thermal(adb.shell2("dumpsys thermalservice", v2=True, timeout=30).stdout)
    assert status == 0
    assert temps["cpu-1-0"] == (37.5, 0, 0) and temps["skin-therm"] == (31.0, 3, 0)
    assert temps["nsphvx-0"][1] == 9 and temps["battery"][1] == 2
    virtual_farm.set_phone(dev.serial, thermal={"skin-therm": 44.0})  # past SEVERE (43), not CRITICAL
    status, temps = _thermal(adb.shell2("dumpsys thermalservice", v2=True, timeout=30).stdout)
    assert temps["skin-therm"] == (44.0, 3, 3) and status == 3
    virtual_farm.set_phone(dev.serial, thermal={"cpu-1-0": 120.0})
    status, temps = _thermal(adb.shell2("dumpsys thermalservice", v2=True, timeout=30).stdout)
    assert temps["cpu-1-0"][2] == 6 and status == 6  # SHUTDOWN


def test_unknown_service_is_refused(device):
    r = _sh(device, "dumpsys nosuchservice")
    assert r.returncode != 0 and "Can't find service: nosuchservice" in r.stderr


def test_sha256sum_is_the_devices_own_and_prints_toybox_lines(device):
    """/system/bin/sha256sum (toybox's hashes with the CPU's SHA instructions; the host's coreutils
    does not): the digests are sha256's, files and stdin, a missing file is an error that leaves the
    others hashed."""
    body = bytes(range(256)) * 4097
    want = hashlib.sha256(body).hexdigest()
    ws = "/data/local/tmp/hashsum-test"
    r = _sh(device, f"mkdir -p {ws} && cd {ws} && head -c 1048832 /dev/zero > zero && "
                    f"printf 'a b' > 'sp ace' && command -v sha256sum")
    assert r.returncode == 0 and r.stdout.strip() == "/system/bin/sha256sum", r.stderr
    device.sync.push(body, f"{ws}/body")
    r = _sh(device, f"cd {ws} && sha256sum -- body 'sp ace' missing zero; echo rc=$?; "
                    f"cat body | sha256sum; sha256sum -b body; sha256sum -c body; echo rc=$?")
    zero = hashlib.sha256(b"\0" * 1048832).hexdigest()
    assert r.stdout.splitlines() == [
        f"{want}  body", f"{hashlib.sha256(b'a b').hexdigest()}  sp ace", f"{zero}  zero", "rc=1",
        f"{want}  -", want, "rc=1"]
    assert r.stderr.splitlines() == ["sha256sum: missing: No such file or directory",
                                     "sha256sum: Unknown option 'c'"]
    _sh(device, f"rm -rf {ws}")
