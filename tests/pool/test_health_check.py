"""The scheduled health check (``farm pool watch --health``): every idle device is checked under a
lease; a healthy one passes, a wedged one climbs the recovery ladder (back in service if a rung cures
it, quarantined with the reason if none does), one without room is quarantined, a leased one is left
alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from farm import session
from farm.config import DEFAULT_WORKSPACE, RecoveryConfig
from farm.device.discovery import discover
from farm.pool import AVAILABLE, LEASED, QUARANTINED, Holder, LeaseRequest, Pool
from farm.procs import wait_until
from farm.session import Farm, FarmAddress
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.virtual.faults import read_faults
from farm.virtual.manager import free_port
from tests.support.pool import REPO, reaped

QUICK = {"return_timeout_s": 1, "boot_timeout_s": 1, "reboot_timeout_s": 60, "probe_timeout_s": 1}


def _farm(virtual_farm, pool) -> Farm:
    address = FarmAddress(pool_url="unused", servers=(str(virtual_farm.adb_server),),
                          workspace=DEFAULT_WORKSPACE, virtual=True)
    return Farm(address=address, pool=pool)


def _device(pool, serial):
    return next(d.device for d in pool.status().devices if d.device.serial == serial)


def test_a_health_pass_checks_the_idle_devices_and_takes_out_the_one_it_cannot_cure(virtual_farm,
                                                                                     pool_url):
    healthy, wedged, busy = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")] * 3)
    with Pool.open(pool_url) as pool:
        pool.sync(discover([virtual_farm.adb_server]), [virtual_farm.adb_server])
        virtual_farm.set_faults(wedged.serial, hang_until_reboot=True)  # wedged after it was found
        virtual_farm.set_faults(busy.serial, hang_until_reboot=True)  # would fail: but it is leased
        held = pool.acquire(LeaseRequest(serial=busy.serial), Holder.current("a test"), ttl_s=300,
                            timeout_s=5)
        ladder = RecoveryConfig(rungs=("return", "boot"), **QUICK)
        checks = {c.serial: c for c in _farm(virtual_farm, pool).check_health(ladder)}
        assert checks[healthy.serial].verdict == "passed", checks
        assert checks[wedged.serial].verdict == "quarantined", checks
        assert "health check failed: shell did not answer" in checks[wedged.serial].detail
        assert busy.serial not in checks  # leased: not idle, not checked
        assert _device(pool, healthy.serial).state == AVAILABLE  # its check's lease was given back
        quarantined = _device(pool, wedged.serial)
        assert quarantined.state == QUARANTINED and "recovery: failed" in quarantined.reason
        assert _device(pool, busy.serial).state == LEASED  # never touched under its holder
        assert read_faults(busy.root).hang_until_reboot
        rungs = [e.detail for e in pool.history(wedged.serial, limit=None) if e.kind == "recovery"]
        assert rungs and rungs[0].startswith("health check: rung return"), rungs
        held.release()


def test_a_wedged_device_cured_by_the_reboot_rung_stays_in_service(virtual_farm, pool_url):
    (wedged,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    with Pool.open(pool_url) as pool:
        pool.sync(discover([virtual_farm.adb_server]), [virtual_farm.adb_server])
        virtual_farm.set_faults(wedged.serial, hang_until_reboot=True)
        [check] = _farm(virtual_farm, pool).check_health(RecoveryConfig(**QUICK))
        assert check.verdict == "recovered", check
        assert _device(pool, wedged.serial).state == AVAILABLE
        assert not read_faults(wedged.root).hang_until_reboot


def test_a_device_without_room_is_taken_out(virtual_farm, pool_url, monkeypatch):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    monkeypatch.setattr(session, "HEALTH_MIN_FREE_BYTES", 1 << 62)  # more than any disk has
    with Pool.open(pool_url) as pool:
        pool.sync(discover([virtual_farm.adb_server]), [virtual_farm.adb_server])
        [check] = _farm(virtual_farm, pool).check_health(RecoveryConfig(**QUICK))
        assert check.verdict == "quarantined" and "bytes free in the workspace" in check.detail, check
        assert _device(pool, dev.serial).state == QUARANTINED


def test_farm_pool_watch_health_takes_a_wedged_device_out(tmp_path, pool_url):
    port = free_port()
    config = tmp_path / "farm.toml"
    config.write_text(f'[farm]\nhome = "{tmp_path / "home"}"\n[[adb_servers]]\nport = {port}\n'
                      f'[pool]\nurl = "{pool_url}"\nliveness_s = 30\n'
                      '[recovery]\nrungs = ["return"]\nreturn_timeout_s = 1\nprobe_timeout_s = 1\n')
    vf = VirtualFarm(home=tmp_path / "home", adb_port=port)
    try:
        good, bad = vf.up([VirtualDeviceSpec(soc="SM8650")] * 2)
        with Pool.open(pool_url) as pool:
            pool.sync(discover([vf.adb_server]), [vf.adb_server])
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        watcher = subprocess.Popen([sys.executable, "-c", "from farm.cli.main import main; main()",
                                    "pool", "watch", "--health", "--health-every", "2", "--interval", "1", "--config",
                                    str(config)],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = []
        with reaped({"watch": watcher}):
            def wait_for(text: str) -> None:
                while not any(text in line for line in lines):
                    line = watcher.stderr.readline()
                    assert line, "".join(lines)
                    lines.append(line)

            # Its first pass at start finds both healthy; the bad one is wedged after that (a device
            # wedged before the watcher's start-up sync goes offline there: it cannot be probed).
            wait_for("health: 2 of 2 idle device(s) passed")
            vf.set_faults(bad.serial, hang_until_reboot=True)
            wait_for("health: 1 of 2 idle device(s) passed")
            watcher.send_signal(signal.SIGTERM)
            rest = watcher.stderr.read()  # after what readline buffered: not communicate()
            watcher.wait(timeout=20)
        output = "".join(lines) + rest
        assert f"health: {bad.serial} quarantined: health check failed" in output, output
        with Pool.open(pool_url) as pool:
            assert wait_until(lambda: _device(pool, bad.serial).state == QUARANTINED, 5)
            assert _device(pool, good.serial).state == AVAILABLE
    finally:
        vf.down()
