"""The cooldown before a throughput measurement (fixtures/llm.py ``wait_cool``) on a hot virtual device,
made hot the way a person would: ``dumpsys battery set temp 480`` through the device's shell."""

from __future__ import annotations

import threading
import time

import pytest

from farm.devices import find_device, scan_server
from farm.errors import DeviceTimeout, InfraError
from farm.fence import FencedDevice
from farm.pool import LeaseRequest, Pool
from farm.virtual import VirtualDeviceSpec
from ptefarm_fixtures.llm import DeviceTooHot, LeasedDevice


@pytest.fixture
def leased(virtual_farm, tmp_path):
    """A virtual SM8650 leased from a pool of its own and fenced, as the plugin hands it to a test."""
    (record,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    server = virtual_farm.adb_server
    with Pool.open(f"sqlite:///{tmp_path / 'pool.db'}") as pool:
        pool.sync(scan_server(server).devices, [server])
        with pool.acquire(LeaseRequest(serial=record.serial), ttl_s=60, timeout_s=10) as lease:
            adb = find_device([server], record.serial)
            fenced = FencedDevice(adb, lease)
            fenced.claim()
            yield LeasedDevice(lease, fenced, "SM8650", "v75", virtual=True), adb


def _set_temp(adb, tenths: int) -> None:
    result = adb.shell(f"dumpsys battery set temp {tenths}", timeout=30)
    assert result.exit_code == 0, result.err


def test_hot_device_waits_then_times_out_as_infra(leased):
    device, adb = leased
    assert device.battery_temp_c() < 40  # a fresh virtual device is cool
    _set_temp(adb, 480)
    assert device.battery_temp_c() == 48.0
    started = time.monotonic()
    with pytest.raises(DeviceTooHot) as caught:
        device.wait_cool(40, timeout_s=1.5, poll_s=0.2)
    waited = time.monotonic() - started
    error = caught.value
    assert isinstance(error, InfraError) and isinstance(error, DeviceTimeout)  # never a test failure
    assert 1.5 <= waited < 10  # it waited the whole timeout, then gave up
    assert (error.serial, error.temp_c, error.limit_c) == (device.serial, 48.0, 40)
    assert 1.5 <= error.waited_s <= waited
    message = str(error)
    assert device.serial in message and "48.0 C" in message and "under 40 C" in message
    assert f"waiting {error.waited_s:.1f} s" in message


def test_device_that_cools_during_the_wait_lets_the_test_go_on(leased):
    device, adb = leased
    _set_temp(adb, 480)
    # Another thread (its own adb connection) cools the device after a second: back to the sysfs value.
    cools = threading.Timer(1.0, lambda: adb.shell("dumpsys battery reset", timeout=30))
    started = time.monotonic()
    cools.start()
    try:
        temp = device.wait_cool(40, timeout_s=30, poll_s=0.2)
    finally:
        cools.join()
    assert time.monotonic() - started >= 1.0  # it did wait for the heat to go
    assert temp is not None and temp < 40
    # ... and the test goes on with the same, still fenced, device.
    assert device.shell("echo go on", timeout=30).out.strip() == "go on"


def test_a_cool_device_does_not_wait(leased):
    device, _ = leased
    started = time.monotonic()
    assert device.wait_cool(40, timeout_s=30, poll_s=5) < 40
    assert time.monotonic() - started < 5
