"""Liveness: a device is leased only if it was seen within ``pool.liveness_s``; a watcher (in every
open farm, and ``farm pool watch``) keeps live devices fresh and takes dead ones offline;
``farm virtual up/down`` keep the pool in step; ``prune`` forgets long-gone devices."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from farm.config import DEFAULT_WORKSPACE, PoolConfig
from farm.errors import LeaseTimeout
from farm.pool import AVAILABLE, OFFLINE, QUARANTINED, LeaseRequest, Pool
from farm.procs import wait_until
from farm.session import Farm, FarmAddress, watching
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.virtual.manager import free_port
from tests.support.pool import REPO, fake_device, reaped

DAY = 86400.0


def _states(pool) -> dict[str, str]:
    return {d.device.serial: d.device.state for d in pool.status().devices}


def _device(pool, serial):
    return next(d.device for d in pool.status().devices if d.device.serial == serial)


def test_a_device_not_seen_within_the_bound_is_not_leased(pool_url):
    with Pool.open(pool_url, PoolConfig(liveness_s=0.5), poll_s=0.02) as pool:
        pool.sync([fake_device("dev0")])
        time.sleep(0.7)
        with pytest.raises(LeaseTimeout, match="not seen for"):
            pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0.2)
        assert _states(pool) == {"dev0": OFFLINE}
        pool.sync([fake_device("dev0")])  # found again: back at once
        assert _states(pool) == {"dev0": AVAILABLE}
        time.sleep(0.3)
        pool.record_success("dev0")  # it did work: it answers
        time.sleep(0.3)  # 0.6 s after the sync, 0.3 s after the success
        pool.release(pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0).token)


def test_a_waiter_is_served_when_a_sync_finds_the_device_again(pool_url):
    import threading

    with Pool.open(pool_url, PoolConfig(liveness_s=0.3), poll_s=0.02) as pool:
        pool.sync([fake_device("dev0")])
        time.sleep(0.5)
        timer = threading.Timer(0.5, lambda: pool.sync([fake_device("dev0")]))
        timer.start()
        try:
            lease = pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=10)
        finally:
            timer.join()
        assert lease.serial == "dev0"


@pytest.fixture
def two_devices(virtual_farm, pool_url):
    """Two live SM8650s on a farm whose pool has a 2 s liveness bound."""
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8650")])
    address = FarmAddress(pool_url=pool_url, servers=(str(virtual_farm.adb_server),),
                          workspace=DEFAULT_WORKSPACE, virtual=True)
    with Pool.open(pool_url, PoolConfig(liveness_s=2.0)) as pool:
        farm = Farm(address=address, pool=pool)
        farm.sync()
        yield virtual_farm, farm, [d.serial for d in virtual_farm.devices]


def test_a_killed_device_is_not_leased_after_the_bound(two_devices):
    vf, farm, (dead, alive) = two_devices
    vf.kill(dead)  # no `virtual down`, nobody syncs: only the bound protects the next holder
    time.sleep(2.3)
    with pytest.raises(LeaseTimeout):
        farm.pool.acquire(LeaseRequest(serial=dead), ttl_s=30, timeout_s=0.3)
    assert _device(farm.pool, dead).state == OFFLINE


def test_the_watcher_keeps_live_devices_and_drops_dead_ones(two_devices):
    vf, farm, (dead, alive) = two_devices
    with watching(farm, interval_s=0.3):
        vf.kill(dead)
        assert wait_until(lambda: _device(farm.pool, dead).state == OFFLINE, timeout=2.0), \
            f"{dead} not offline within the bound"
        time.sleep(2.5)  # past the bound: the watcher kept the live one fresh
        lease = farm.pool.acquire(LeaseRequest(socs=["SM8650"]), ttl_s=30, timeout_s=1)
        assert lease.serial == alive
        farm.pool.release(lease.token)
        vf.restart(dead)
        assert wait_until(lambda: _device(farm.pool, dead).state == AVAILABLE, timeout=10.0), \
            f"{dead} not back after restart"


def _farm_cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "import farm.cli.pool_admin; from farm.cli.main import main; main()",
            *args]


@pytest.fixture
def farm_config_file(tmp_path, pool_url):
    """A farm config with its own home, adb server port and pool (liveness 2 s)."""
    port = free_port()
    path = tmp_path / "farm.toml"
    path.write_text(f'[farm]\nhome = "{tmp_path / "home"}"\n[[adb_servers]]\nport = {port}\n'
                    f'[pool]\nurl = "{pool_url}"\nliveness_s = 2\n')
    yield path
    VirtualFarm(home=tmp_path / "home", adb_port=port).down()  # whatever a failed test left


def test_virtual_up_and_down_keep_the_pool_in_step(farm_config_file, pool_url):
    from farm.cli.main import main

    up = CliRunner().invoke(main, ["virtual", "up", "--soc", "SM8650:2", "--config",
                                   str(farm_config_file)])
    assert up.exit_code == 0, up.output
    with Pool.open(pool_url) as pool:
        states = _states(pool)
    assert list(states.values()) == [AVAILABLE, AVAILABLE] and "added" in up.output
    down = CliRunner().invoke(main, ["virtual", "down", "--config", str(farm_config_file)])
    assert down.exit_code == 0, down.output
    with Pool.open(pool_url) as pool:
        assert set(_states(pool).values()) == {OFFLINE}
        with pytest.raises(LeaseTimeout):
            pool.acquire(LeaseRequest(socs=["SM8650"]), ttl_s=30, timeout_s=0.2)
    assert "offline" in down.output


def test_farm_pool_watch_until_sigterm(farm_config_file, pool_url, tmp_path):
    from farm.cli.main import main

    assert CliRunner().invoke(main, ["virtual", "up", "--soc", "SM8650:2", "--config",
                                     str(farm_config_file)]).exit_code == 0
    vf = VirtualFarm(home=tmp_path / "home")
    dead, alive = (d.serial for d in vf.devices)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    watcher = subprocess.Popen(_farm_cli("pool", "watch", "--interval", "0.3", "--config",
                                         str(farm_config_file)),
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped({"watch": watcher}):
        # From the watcher's first word: its start-up (seconds of imports on a loaded host) is not
        # what the liveness bound is about.
        first = watcher.stderr.readline()
        assert "watching" in first, first
        vf.kill(dead)
        with Pool.open(pool_url) as pool:
            assert wait_until(lambda: _device(pool, dead).state == OFFLINE, timeout=5.0), \
                f"{dead} not offline"
            time.sleep(2.5)
            lease = pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=1)
            assert lease.serial == alive
            pool.release(lease.token)
        watcher.send_signal(signal.SIGTERM)
        out, err = watcher.communicate(timeout=10)
    assert watcher.returncode == 0, err
    assert "stopped" in err


def test_watch_refuses_an_interval_past_the_bound(farm_config_file):
    from farm.cli.main import main

    result = CliRunner().invoke(main, ["pool", "watch", "--interval", "5", "--config",
                                       str(farm_config_file)])
    assert result.exit_code == 2 and "pool.liveness_s" in result.output


# -- prune --------------------------------------------------------------------------------------------


def _age(pool, serial: str, days: float) -> None:
    """Pretend the device was last seen and changed state ``days`` ago (and its events happened
    then)."""
    with pool.store.write() as txn:
        txn.run("UPDATE devices SET last_seen = last_seen - ?, state_since = state_since - ? "
                "WHERE serial = ?", (days * DAY, days * DAY, serial))
        txn.run("UPDATE events SET at = at - ? WHERE serial = ?", (days * DAY, serial))


def test_prune_drops_long_gone_devices_and_keeps_leased_ones(pool):
    pool.sync([fake_device(s) for s in ("gone", "held", "sick", "recent", "here")])
    lease = pool.acquire(LeaseRequest(serial="held"), ttl_s=600, timeout_s=0)
    pool.release(pool.acquire(LeaseRequest(serial="gone"), ttl_s=600, timeout_s=0).token)
    pool.quarantine("sick", "usb resets")
    pool.sync([fake_device("here")])  # all others vanish
    for serial in ("gone", "held", "sick"):
        _age(pool, serial, 40)
    _age(pool, "recent", 10)
    assert pool.prune(30 * DAY) == ["gone"]
    states = _states(pool)
    assert states == {"held": OFFLINE, "sick": QUARANTINED, "recent": OFFLINE, "here": AVAILABLE}
    assert [e.kind for e in pool.history(serial="gone")] == ["pruned"]
    pool.release(lease.token)  # its lease ended: the row can go now
    assert pool.prune(30 * DAY) == ["held"]
    assert pool.prune(5 * DAY) == ["recent"]
    pool.sync([fake_device("here"), fake_device("gone")])  # a pruned device that returns is new
    assert _states(pool)["gone"] == AVAILABLE


def test_farm_pool_prune(pool_url, tmp_path, monkeypatch):
    from farm.cli.main import main

    monkeypatch.delenv("PTEFARM_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    with Pool.open(pool_url) as pool:
        pool.sync([fake_device("old"), fake_device("new")])
        pool.sync([fake_device("new")])
        _age(pool, "old", 3)
    config = tmp_path / "farm.toml"
    config.write_text(f'[pool]\nurl = "{pool_url}"\nretention_days = 7\n')
    result = CliRunner().invoke(main, ["pool", "prune", "--config", str(config)])
    assert result.exit_code == 0 and "pruned 0 device(s) offline for over 7 day(s)" in result.output
    result = CliRunner().invoke(main, ["pool", "prune", "--older-than", "2", "--config", str(config)])
    assert result.exit_code == 0 and "pruned 1 device(s) offline for over 2 day(s): old" in result.output
    result = CliRunner().invoke(main, ["pool", "prune", "--older-than", "-1", "--url", pool_url])
    assert result.exit_code == 2 and "--older-than" in result.output
