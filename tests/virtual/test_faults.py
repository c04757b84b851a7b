"""Faults of virtual devices: dropped connection mid-push, full disk, hanging commands, kill/restart."""

from __future__ import annotations

import os
import subprocess
import time

import adbutils
import pytest

from farm.device.adb_server import adb_binary
from farm.errors import UsageError
from farm.virtual import VirtualDeviceSpec
from farm.virtual.manager import is_device_process


@pytest.fixture
def farm_and_device(virtual_farm):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    return virtual_farm, dev


def _leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def _big_push(farm_and_device, tmp_path, mib: int, folder: str, **faults):
    """The device with ``faults`` on, a random file of ``mib`` MiB and where on the device to push it;
    returns (farm, device, file, target, push) where ``push()`` pushes the file there."""
    vf, dev = farm_and_device
    vf.set_faults(dev.serial, **faults)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(mib << 20))
    remote = f"{dev.workspace}/{folder}/big.bin"
    target = dev.host_path(remote)  # where the device keeps it, checked on the host
    return vf, dev, src, target, lambda: vf.client().device(dev.serial).sync.push(src, remote)


def test_drop_after_bytes_fails_push_and_leaves_no_file(farm_and_device, tmp_path):
    vf, dev, src, target, push = _big_push(farm_and_device, tmp_path, 4, "drop", drop_after_bytes=1 << 20)
    with pytest.raises((adbutils.AdbError, OSError)):
        push()
    assert not target.exists()
    vf.clear_faults(dev.serial)
    # the server re-attaches the device by itself; then the same push works
    vf.server.wait_for_state(dev.serial, "device", timeout=60)
    deadline = time.monotonic() + 10  # the device notices the drop on its own thread
    while _leftovers(target.parent) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _leftovers(target.parent) == []  # the partial temp file was removed too
    push()
    assert target.read_bytes() == src.read_bytes()


def test_disk_full_gives_clean_push_failure(farm_and_device, tmp_path):
    vf, dev, src, target, push = _big_push(farm_and_device, tmp_path, 3, "full",
                                           disk_full_after_bytes=1 << 20)
    with pytest.raises(adbutils.AdbError):
        push()
    remote = f"{dev.workspace}/full/big.bin"
    cli = subprocess.run([adb_binary(), "-P", str(vf.adb_server.port), "-s", dev.serial, "push",
                          str(src), remote], env=vf.server.env(), capture_output=True,
                         text=True, timeout=60, check=False)
    assert cli.returncode != 0
    assert "No space left on device" in cli.stderr + cli.stdout
    assert _leftovers(target.parent) == []
    # the transport is still fine, and small files still fit
    device = vf.client().device(dev.serial)
    device.sync.push(b"small", remote)
    assert target.read_bytes() == b"small"


def test_hang_commands_hang_until_killed(farm_and_device):
    vf, dev = farm_and_device
    vf.set_faults(dev.serial, hang_commands=r"^run-model\b")
    device = vf.client().device(dev.serial)
    with pytest.raises(adbutils.AdbTimeout):
        device.shell("run-model --fast", timeout=1.5)
    assert device.shell2("echo alive", v2=True).stdout == "alive\n"
    vf.clear_faults(dev.serial)
    assert device.shell2("run-model --fast", v2=True).returncode == 127  # runs for real again


def test_slow_device_still_delivers(farm_and_device):
    vf, dev = farm_and_device
    vf.set_faults(dev.serial, slow_bytes_per_s=4 << 20)
    device = vf.client().device(dev.serial)
    data = os.urandom(256 << 10)
    device.sync.push(data, f"{dev.workspace}/slow.bin")
    assert device.sync.read_bytes(f"{dev.workspace}/slow.bin") == data


def test_the_slow_link_is_shared_by_concurrent_streams(farm_and_device):
    """The rate is the device's cable, not each stream's: two pushes at once take as long as both
    bytes at the rate (a lower bound, which a loaded host can only exceed)."""
    from concurrent.futures import ThreadPoolExecutor

    vf, dev = farm_and_device
    rate, size = 4 << 20, 2 << 20
    vf.set_faults(dev.serial, slow_bytes_per_s=rate)
    datas = [os.urandom(size) for _ in range(2)]

    def push(i: int) -> None:
        vf.client().device(dev.serial).sync.push(datas[i], f"{dev.workspace}/link{i}.bin")

    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(push, range(2)))
    elapsed = time.monotonic() - started
    assert elapsed >= 0.95 * 2 * size / rate, elapsed  # one stream's share alone would be half that
    for i in range(2):
        assert vf.client().device(dev.serial).sync.read_bytes(f"{dev.workspace}/link{i}.bin") == datas[i]


def test_kill_and_restart_keeps_state(farm_and_device):
    vf, dev = farm_and_device
    device = vf.client().device(dev.serial)
    device.sync.push(b"survives", f"{dev.workspace}/kept.txt")
    vf.kill(dev.serial)
    assert not is_device_process(dev.pid, dev.root)
    vf.server.wait_for_state(dev.serial, "offline", timeout=30)
    with pytest.raises(adbutils.AdbError):
        device.shell2("true", v2=True)
    new = vf.restart(dev.serial)
    assert new.port == dev.port and new.serial == dev.serial and new.pid != dev.pid
    assert vf.server.devices()[dev.serial] == "device"
    device = vf.client().device(dev.serial)
    assert device.shell("cat data/local/tmp/ptefarm/kept.txt") == "survives"
    assert device.shell("getprop ro.serialno") == dev.serialno


def test_bad_faults_are_usage_errors(farm_and_device):
    vf, dev = farm_and_device
    with pytest.raises(UsageError, match="drop_after_bytes"):
        vf.set_faults(dev.serial, drop_after_bytes=-1)
    with pytest.raises(UsageError, match="hang_commands"):
        vf.set_faults(dev.serial, hang_commands="(")
    with pytest.raises(UsageError, match="unexpected keyword"):
        vf.set_faults(dev.serial, explode=True)
    with pytest.raises(UsageError, match="no virtual device 'nope'"):
        vf.set_faults("nope", drop_after_bytes=1)
