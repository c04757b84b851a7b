"""A virtual device runs its commands and sync sessions inside its own Android view (bubblewrap
namespaces): not as root, seeing only its own storage, unable to write anything of the host, and
unable to see another device. Where namespaces are not available it refuses to start, or runs
unconfined when asked to and says so. Its phone state (battery, thermal zones) is settable."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from farm.device.discovery import find_device
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.virtual import manager as manager_mod
from farm.virtual.confine import BWRAP_ENV, UNCONFINED_ENV, ConfinementUnavailable, host_runtime_paths

# What / holds inside a view: Android's directories, the merged-/usr links, and the top directories
# of the read-only host pieces Python needs (the venv, the base interpreter, the farm package).
ANDROID_TOP = {"data", "dev", "etc", "proc", "sdcard", "storage", "sys", "system", "tmp", "vendor",
               "usr", "bin", "sbin", "lib", "lib32", "lib64"}
RUNTIME_TOP = {p.parts[1] for p in host_runtime_paths()}


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    with VirtualFarm(home=tmp_path_factory.mktemp("confined")) as vf:
        a, b = vf.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8550")])
        yield vf, a, b


def _sh(vf, dev, command: str):
    return vf.client().device(dev.serial).shell2(command, v2=True, timeout=30)


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")} if root.exists() else set()


def test_commands_run_as_shell_not_root(two):
    vf, a, _ = two
    r = _sh(vf, a, "id; pwd; hostname")
    assert r.returncode == 0
    ident, cwd, hostname = r.stdout.splitlines()
    assert ident.startswith("uid=2000(shell) gid=2000(shell)")
    assert cwd == "/" and hostname == "e3q"  # adb shell starts at /; hostname = ro.product.device
    assert _sh(vf, a, "cat /proc/self/status | grep ^CapEff").stdout.split()[1] == "0" * 16


def test_root_looks_like_android_and_shows_no_host_dirs(two):
    vf, a, _ = two
    top = set(_sh(vf, a, "ls /").stdout.split())
    assert {"data", "system", "proc", "dev", "sys", "sdcard", "vendor", "tmp"} <= top
    assert top <= ANDROID_TOP | RUNTIME_TOP, top - ANDROID_TOP - RUNTIME_TOP
    for host_only in ("home", "opt", "var", "boot", "mnt", "srv", "media"):
        assert host_only not in top
    # Of the read-only host pieces, only what Python needs: e.g. nothing of /root but the interpreter.
    for piece in host_runtime_paths():
        parent = piece.parent
        listed = set(_sh(vf, a, f"ls -A {parent}").stdout.split())
        assert listed <= {p.name for p in host_runtime_paths() if p.parent == parent}, (parent, listed)
    ls_tools = _sh(vf, a, "ls /system/bin").stdout.split()
    assert {"sh", "getprop", "dumpsys", "farm-llama-runner"} <= set(ls_tools)
    assert _sh(vf, a, "readlink /sdcard").stdout.strip() == "/storage/emulated/0"


def test_nothing_of_the_host_is_writable(two):
    vf, a, _ = two
    targets = ["/etc/x", "/x", "/usr/x", "/system/bin/x", "/sys/class/thermal/x", "/vendor/lib64/x",
               *(f"{p}/ptefarm-x" for p in host_runtime_paths())]
    for target in targets:
        r = _sh(vf, a, f"echo pwned > {target}")
        assert r.returncode != 0, target
        assert "Read-only file system" in r.stderr or "No such file" in r.stderr, (target, r.stderr)
        assert not os.path.exists(target)
    # ../../x from adb shell's cwd (/) is /x: refused too; under /data it stays in the device.
    assert _sh(vf, a, "echo pwned > ../../x").returncode != 0
    assert not Path("/x").exists()
    # The only other entries: parents of read-only host pieces that live under /tmp (a checkout there).
    under_tmp = {p.relative_to("/tmp").parts[0] for p in host_runtime_paths()
                 if p.is_relative_to("/tmp")}
    listed = _sh(vf, a, "touch /tmp/private && ls /tmp").stdout.split()
    assert "private" in listed and set(listed) - {"private"} <= under_tmp, listed
    assert not Path("/tmp/private").exists()  # the device's /tmp is its own


def test_push_outside_the_storage_fails_and_the_host_is_untouched(two, tmp_path):
    vf, a, _ = two
    device = vf.client().device(a.serial)
    around = a.root.parent  # nothing new may appear next to the device root
    before = {p for p in around.iterdir() if p != a.root}
    for target in ("/etc/x", "/data/local/tmp/../../../etc/x", "/system/x", "/x"):
        with pytest.raises(Exception, match="FAIL"):
            device.sync.push(b"pwned", target)
    assert not Path("/etc/x").exists() and not Path("/x").exists()
    assert {p for p in around.iterdir() if p != a.root} == before
    # Inside the storage ../ is the device's own business, and lands in its storage.
    device.sync.push(b"mine", "/data/local/tmp/a/../b.txt")
    assert a.host_path("/data/local/tmp/b.txt").read_bytes() == b"mine"


def test_ls_data_local_tmp_shows_only_the_devices_files(two):
    vf, a, _ = two
    _sh(vf, a, "mkdir -p /data/local/tmp/only-mine && touch /data/local/tmp/only-mine/f")
    listed = set(_sh(vf, a, "ls -A /data/local/tmp").stdout.split())
    on_host = {p.name for p in a.host_path("/data/local/tmp").iterdir()}
    assert listed == on_host and "only-mine" in listed


def test_two_devices_cannot_see_each_others_files(two):
    vf, a, b = two
    marker = f"secret-{os.getpid()}"
    assert _sh(vf, a, f"echo a > /data/local/tmp/{marker}").returncode == 0
    assert _sh(vf, b, f"ls /data/local/tmp/{marker}").returncode != 0
    found = _sh(vf, b, f"find / -xdev -name {marker} 2>/dev/null; find /data /tmp -name {marker}")
    assert found.stdout.strip() == ""
    for path in (a.root, a.host_path(f"/data/local/tmp/{marker}")):  # host paths mean nothing
        assert _sh(vf, b, f"test -e {path}").returncode != 0
    # nor each other's processes: one pid namespace per device
    _sh(vf, a, "setsid sleep 4711 </dev/null >/dev/null 2>&1 &")
    sleeper = _eventually(lambda: _host_pids(["sleep", "4711"]))  # forked, then exec'd a moment later
    assert "sleep 4711" in _sh(vf, a, "ps -A -o args").stdout
    assert "sleep 4711" not in _sh(vf, b, "ps -A -o args").stdout
    assert sleeper and set(sleeper) <= set(vf.processes(a.serial))  # the host can tell whose it is
    assert not set(vf.processes(a.serial)) & set(vf.processes(b.serial))
    _sh(vf, a, "pkill -f 'sleep 4711'")
    assert vf.client().device(b.serial).sync.exists(f"/data/local/tmp/{marker}") is False


def _host_pids(cmdline: list[str]) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == cmdline]


def _eventually(probe, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (found := probe()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_a_killed_device_leaves_no_process_behind(virtual_farm):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    device = virtual_farm.client().device(dev.serial)
    device.shell2("setsid sleep 4242 </dev/null >/dev/null 2>&1 &", v2=True, timeout=10)

    def sleepers() -> list[int]:
        return _host_pids(["sleep", "4242"])

    # The shell returns once it has forked: the child becomes `sleep` a moment later on a loaded host.
    assert _eventually(sleepers)
    virtual_farm.kill(dev.serial)  # SIGKILL: the namespaces end with it, and all inside
    deadline = time.monotonic() + 10
    while sleepers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sleepers() == []


def test_no_bubblewrap_refuses_to_start_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv(BWRAP_ENV, str(tmp_path / "no-bwrap"))
    monkeypatch.delenv(UNCONFINED_ENV, raising=False)
    monkeypatch.setattr(manager_mod, "_confinement_checked", False)
    with VirtualFarm(home=tmp_path / "farm") as vf:
        with pytest.raises(ConfinementUnavailable, match=f"bwrap.*{UNCONFINED_ENV}=1"):
            vf.up([VirtualDeviceSpec()])
        assert vf.devices == []
        # The device process refuses by itself too (a restart, a device started by another tool).
        monkeypatch.setattr(manager_mod, "check_confinement", lambda: None)
        with pytest.raises(ConfinementUnavailable, match="bwrap.*not found"):
            vf.up([VirtualDeviceSpec()])


def test_unconfined_mode_runs_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(UNCONFINED_ENV, "1")
    monkeypatch.setenv(BWRAP_ENV, str(tmp_path / "no-bwrap"))
    from farm.cli.devices import _device_row

    with VirtualFarm(home=tmp_path / "farm") as vf:
        (dev,) = vf.up([VirtualDeviceSpec()])
        assert not dev.confined
        device = find_device([vf.adb_server], dev.serial)
        info = device.info()
        assert info.virtual and info.confined is False
        assert info.workspace == str(dev.root / "data" / "local" / "tmp" / "ptefarm")  # a host path
        assert "unconfined" in _device_row(info, with_server=False)
        client = vf.client().device(dev.serial)
        client.sync.push(b"ok", f"{info.workspace}/f")
        assert dev.host_path(f"{info.workspace}/f").read_bytes() == b"ok"
        with pytest.raises(Exception, match="FAIL"):
            client.sync.push(b"pwned", str(tmp_path / "outside"))
        assert not (tmp_path / "outside").exists()
        assert client.shell("getprop ro.ptefarm.confined") == "0"


def test_confined_device_info(two):
    vf, a, _ = two
    info = find_device([vf.adb_server], a.serial).info()
    assert info.virtual and info.confined is True and info.workspace == "/data/local/tmp/ptefarm"


# --- phone state ------------------------------------------------------------------------------------

def test_phone_state_reaches_sysfs_dumpsys_and_device_info(virtual_farm):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    device = find_device([virtual_farm.adb_server], dev.serial)
    before = device.info()
    assert before.battery_level == 87 and before.battery_temp_c == 31.2
    assert before.thermal["cpu-1-0"] == 37.5 and len(before.thermal) == 5
    virtual_farm.set_phone(dev.serial, battery_level=42, battery_temp_c=44.5,
                           thermal={"cpu-1-0": 81.25, "thermal_zone0": 70, "camera-0": 40})
    shell = virtual_farm.client().device(dev.serial)
    assert shell.shell("cat /sys/class/thermal/thermal_zone1/type /sys/class/thermal/thermal_zone1/temp"
                       ).split() == ["cpu-1-0", "81250"]  # millidegrees, like Linux
    assert shell.shell("cat /sys/class/power_supply/battery/temp") == "445"  # tenths, like Android
    after = device.info()
    assert after.battery_level == 42 and after.battery_temp_c == 44.5
    assert after.thermal["cpu-1-0"] == 81.25 and after.thermal["cpu-0-0"] == 70
    assert after.thermal["camera-0"] == 40
    # dumpsys battery set overrides what dumpsys reports, as on a phone, until reset.
    assert shell.shell2("dumpsys battery set temp 500", v2=True).returncode == 0
    assert device.info().battery_temp_c == 50.0
    assert shell.shell("cat /sys/class/power_supply/battery/temp") == "445"
    shell.shell("dumpsys battery reset")
    assert device.info().battery_temp_c == 44.5


def test_bad_phone_state_is_a_usage_error(virtual_farm):
    from farm.errors import UsageError

    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    for bad in ({"battery_level": 101}, {"battery_temp_c": float("nan")},
                {"thermal": {"thermal_zone9": 40}}, {"thermal": {"bad zone": 40}}):
        with pytest.raises(UsageError):
            virtual_farm.set_phone(dev.serial, **bad)
    with pytest.raises(UsageError, match="no virtual device 'nope'"):
        virtual_farm.set_phone("nope", battery_level=1)


def test_hot_device_makes_the_cooldown_wait_then_time_out(virtual_farm):
    """fixtures/llm.py's wait_cool against a hot virtual device: it waits while hot, returns once
    cool, and a device that stays hot is an infrastructure error naming it."""
    from farm.errors import DeviceTimeout, InfraError
    from ptefarm_fixtures.llm import LeasedDevice

    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    device = find_device([virtual_farm.adb_server], dev.serial)

    class _Lease:  # wait_cool only checks that the lease is still held
        serial = dev.serial

        def check(self) -> None:
            return None

    leased = LeasedDevice(lease=_Lease(), adb=device, soc="SM8650", htp_arch="v75", virtual=True)
    virtual_farm.set_phone(dev.serial, battery_temp_c=48)
    with pytest.raises(DeviceTimeout, match=f"{dev.serial} still at 48.0 C") as caught:
        leased.wait_cool(40, timeout_s=1.0, poll_s=0.2)
    assert isinstance(caught.value, InfraError)
    cools = threading.Timer(1.5, lambda: virtual_farm.set_phone(dev.serial, battery_temp_c=33))
    started = time.monotonic()
    cools.start()
    try:
        assert leased.wait_cool(40, timeout_s=30, poll_s=0.2) == 33.0
    finally:
        cools.join()
    assert time.monotonic() - started >= 1.4


def test_python_of_the_host_runs_inside(two):
    vf, a, _ = two
    r = _sh(vf, a, f"{sys.executable} -c 'import farm.runner.main, torch; print(torch.__version__)'")
    assert r.returncode == 0, r.stderr
