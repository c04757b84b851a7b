"""Blame the right part: an adb server that is down is the server's fault (AdbServerDown, healed by
restarting the farm's own server), failures in a burst count once toward quarantine, and a device
that vanished is offline (and comes back), not quarantined."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from farm.adb_server import adb_binary
from farm.devices import discover, find_device, scan_server
from farm.errors import AdbError, AdbServerDown, DeviceGone, InfraError
from farm.pool import AVAILABLE, OFFLINE, QUARANTINED, Pool
from farm.pool.schema import SCHEMA_VERSION
from farm.procs import cmdline, wait_until
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from tests.support.pool import fake_device

# -- the adb server is down ----------------------------------------------------------------------------


def _kill_adb_server(vf: VirtualFarm) -> None:
    """SIGKILL the farm's adb server process itself (not through kill-server), as a crash would."""
    argv = [adb_binary(), "-P", str(vf.server.port), "server", "nodaemon"]
    pids = [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and cmdline(int(p.name)) == argv]
    assert len(pids) == 1, f"adb server on {vf.server.port}: pids {pids}"
    os.kill(pids[0], signal.SIGKILL)
    assert wait_until(lambda: not vf.server.is_running(timeout=0.5), 10)


@pytest.fixture
def farm2(tmp_path):
    with VirtualFarm(home=tmp_path / "farm") as vf:
        records = vf.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8550")])
        yield vf, records


def test_adb_server_killed_mid_command_is_server_down_not_device_gone(farm2):
    vf, records = farm2
    device = find_device([vf.adb_server], records[0].serial)
    errors: list[BaseException] = []

    def long_command():
        try:
            device.shell("sleep 20", timeout=60)
        except BaseException as e:  # noqa: BLE001 - the test inspects whatever was raised
            errors.append(e)

    worker = threading.Thread(target=long_command)
    worker.start()
    time.sleep(1.0)
    _kill_adb_server(vf)
    worker.join(timeout=30)
    assert not worker.is_alive()
    (error,) = errors
    assert isinstance(error, AdbServerDown) and not isinstance(error, DeviceGone), repr(error)
    assert str(vf.adb_server) in str(error) and error.server == str(vf.adb_server)
    assert error.serial == records[0].serial and "sleep 20" in str(error)
    # Every later request says the same, naming the server; nothing restarts it behind our back.
    with pytest.raises(AdbServerDown, match=f"adb server {vf.adb_server} unreachable"):
        device.shell("echo hi", timeout=10)
    with pytest.raises(AdbServerDown, match=str(vf.adb_server)):
        discover([vf.adb_server])
    with pytest.raises(AdbServerDown, match=str(vf.adb_server)) as caught:
        find_device([vf.adb_server], records[1].serial)
    assert caught.value.serial == records[1].serial
    scan = scan_server(vf.adb_server)
    assert isinstance(scan.failure, AdbServerDown) and str(vf.adb_server) in scan.error
    with pytest.raises(AdbServerDown, match=str(vf.adb_server.port)):
        vf.server.devices()
    assert not vf.server.is_running()


def test_heal_restarts_the_server_and_reconnects_live_devices(farm2, tmp_path):
    vf, (alive, killed) = farm2
    with Pool.open(f"sqlite:///{tmp_path / 'pool.db'}") as pool:
        pool.sync(discover([vf.adb_server]), [vf.adb_server])
        assert vf.heal().changed is False  # healthy: nothing to do
        vf.kill(killed.serial)
        _kill_adb_server(vf)
        report = vf.heal()
        assert report.server == str(vf.adb_server) and report.server_restarted
        assert report.reconnected == [alive.serial] and report.dead == [killed.serial]
        assert report.failed == {}
        assert vf.server.devices().get(alive.serial) == "device"
        device = find_device([vf.adb_server], alive.serial)
        assert device.shell("echo back", timeout=20, check=True).out == "back\n"
        # The pool: the live device stays usable, the dead one goes offline (not quarantined).
        pool.sync(discover([vf.adb_server]), [vf.adb_server])
        states = {d.device.serial: d.device.state for d in pool.status().devices}
        assert states == {alive.serial: AVAILABLE, killed.serial: OFFLINE}
        assert vf.heal().changed is False
    # The restarted server is the farm's: down() stops it.
    vf.down()
    assert not vf.server.is_running()


def test_heal_is_bounded_then_names_the_server(tmp_path):
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        for _ in range(2):
            _kill_adb_server(vf)
            assert vf.heal(max_restarts=2).reconnected == [record.serial]
        _kill_adb_server(vf)
        with pytest.raises(AdbServerDown, match=f"{vf.adb_server}.*after 2 restarts within 60s"):
            vf.heal(max_restarts=2)
        assert not vf.server.is_running()
        # Outside the window, it may restart again.
        assert vf.heal(max_restarts=2, per_s=0.001).server_restarted


def test_ensure_running_names_the_server_when_it_cannot_start(tmp_path):
    import socket

    from farm.adb_server import AdbServer

    with socket.socket() as squatter:  # something that is not an adb server holds the port
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        server = AdbServer(port=port, home=tmp_path / "adb")
        with pytest.raises(AdbServerDown, match=f"127.0.0.1:{port} is down.*not an adb server") as caught:
            server.ensure_running(timeout=5)
    assert isinstance(caught.value, AdbError) and isinstance(caught.value, InfraError)
    assert caught.value.server == f"127.0.0.1:{port}"


# -- failures in a burst count once ------------------------------------------------------------------


def _device(pool: Pool, serial: str = "dev0"):
    return next(d.device for d in pool.status().devices if d.device.serial == serial)


def test_failures_within_the_window_count_once(pool_url):
    with Pool.open(pool_url, quarantine_after=3, failure_window_s=30) as pool:
        pool.sync([fake_device("dev0")])
        for reason in ("adb server down", "adb server down", "adb server down", "push failed"):
            assert not pool.record_infra_failure("dev0", reason)
        dev = _device(pool)
        assert dev.state == AVAILABLE and dev.infra_failures == 1
        details = [e.detail for e in pool.history(serial="dev0") if e.kind == "infra_failure"]
        assert details[0].startswith("1 in a row")
        assert all("not counted" in d and "30s window" in d for d in details[1:]), details


def test_failures_spread_beyond_the_window_quarantine(pool_url):
    with Pool.open(pool_url, quarantine_after=3, failure_window_s=0.3) as pool:
        pool.sync([fake_device("dev0")])
        assert not pool.record_infra_failure("dev0", "push timed out")
        time.sleep(0.35)
        assert not pool.record_infra_failure("dev0", "push timed out")
        assert not pool.record_infra_failure("dev0", "push timed out")  # same burst: once
        time.sleep(0.35)
        assert pool.record_infra_failure("dev0", "shell: connection reset")
        dev = _device(pool)
        assert dev.state == QUARANTINED and dev.infra_failures == 3
        assert "3 consecutive infra failures" in dev.reason


def test_a_success_resets_the_count_and_the_window(pool_url):
    with Pool.open(pool_url, quarantine_after=2, failure_window_s=30) as pool:
        pool.sync([fake_device("dev0")])
        assert not pool.record_infra_failure("dev0", "a")
        pool.record_success("dev0")
        assert _device(pool).infra_failures == 0
        assert not pool.record_infra_failure("dev0", "b")  # counted: the run starts again
        assert _device(pool).infra_failures == 1


def test_the_default_window_is_a_few_seconds(sqlite_pool_url):
    with Pool.open(sqlite_pool_url) as pool:
        assert 1 <= pool.failure_window_s <= 10
    with pytest.raises(ValueError, match="failure_window_s"):
        Pool.open(sqlite_pool_url, failure_window_s=float("nan"))


# -- a device that vanished is offline, not quarantined ----------------------------------------------


def test_vanished_device_is_offline_and_its_failures_are_forgotten(pool_url):
    a = "127.0.0.1:15037"
    with Pool.open(pool_url, quarantine_after=2, failure_window_s=0) as pool:
        pool.sync([fake_device("dev0", server=a), fake_device("dev1", server=a)], [a])
        # What the plugin does after a device error: record the failure, then resync the server.
        assert not pool.record_infra_failure("dev0", "device dev0 is no longer listed")
        pool.sync([fake_device("dev1", server=a)], [a])
        dev = _device(pool)
        assert dev.state == OFFLINE and dev.infra_failures == 0
        offline = [e for e in pool.history(serial="dev0") if e.kind == "offline"][-1]
        assert "1 infra failure(s) not held against it" in offline.detail
        # While it is away, more failures (other workers' in-flight tests) are not counted.
        for _ in range(3):
            assert not pool.record_infra_failure("dev0", "device gone")
        assert _device(pool).state == OFFLINE and _device(pool).infra_failures == 0
        # It comes back with a clean count.
        pool.sync([fake_device("dev0", server=a), fake_device("dev1", server=a)], [a])
        dev = _device(pool)
        assert dev.state == AVAILABLE and dev.infra_failures == 0
        # A device adb lists but cannot use is offline too, and its count is reset likewise.
        assert not pool.record_infra_failure("dev0", "x")
        pool.sync([fake_device("dev0", server=a, state="offline"), fake_device("dev1", server=a)], [a])
        assert _device(pool).state == OFFLINE and _device(pool).infra_failures == 0


def test_killed_virtual_device_ends_offline_and_returns(tmp_path):
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        with Pool.open(f"sqlite:///{tmp_path / 'pool.db'}", quarantine_after=2,
                       failure_window_s=0) as pool:
            pool.sync(discover([vf.adb_server]), [vf.adb_server])
            device = find_device([vf.adb_server], record.serial)
            vf.kill(record.serial)
            for _ in range(2):  # two workers' tests on it fail, each recording and resyncing
                with pytest.raises(DeviceGone) as caught:
                    device.shell("echo hi", timeout=10)
                pool.record_infra_failure(record.serial, str(caught.value))
                scan = scan_server(vf.adb_server)
                pool.sync(scan.devices, [vf.adb_server])
            dev = _device(pool, record.serial)
            assert dev.state == OFFLINE and dev.infra_failures == 0
            vf.restart(record.serial)
            pool.sync(discover([vf.adb_server]), [vf.adb_server])
            assert _device(pool, record.serial).state == AVAILABLE


# -- the schema ------------------------------------------------------------------------------------------


def test_a_version_1_pool_is_migrated(pool_url):
    with Pool.open(pool_url) as pool:
        pool.sync([fake_device("dev0")])
        with pool.store.write() as txn:
            for column in ("failure_counted_at", "config_tags", "admin_tags"):  # added after 1
                txn.run(f"ALTER TABLE devices DROP COLUMN {column}")
            txn.run("UPDATE pool_meta SET schema_version = 1 WHERE id = 1")
    with Pool.open(pool_url, failure_window_s=30) as pool:
        assert not pool.record_infra_failure("dev0", "x")
        assert not pool.record_infra_failure("dev0", "x")
        assert _device(pool).infra_failures == 1
        with pool.store.read() as txn:
            assert txn.one("SELECT schema_version FROM pool_meta")["schema_version"] == SCHEMA_VERSION
