"""The recovery ladder on virtual devices: each rung brings back the device it is for (one that drops
off its server and returns, one still booting, one whose shell is wedged until a reboot), a healthy
device costs one look, and a device that is absent or beyond the configured rungs is said to be so."""

from __future__ import annotations

import threading
import time

import pytest

from farm.config import RecoveryConfig
from farm.device import recovery
from farm.device.recovery import ABSENT, FAILED, HEALTHY, RECOVERED, Health, probe, recover
from farm.errors import UsageError
from farm.virtual import VirtualDeviceSpec
from farm.virtual.faults import read_faults

QUICK = RecoveryConfig(return_timeout_s=20, boot_timeout_s=20, reboot_timeout_s=60, probe_timeout_s=2)


def _names(result) -> list[tuple[str, bool]]:
    return [(r.name, r.ok) for r in result.rungs]


def test_a_healthy_device_is_looked_at_once_and_left_alone(virtual_farm):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    looks: list[Health] = []

    def counted(server, serial):
        looks.append(probe(server, serial, timeout_s=5))
        return looks[-1]

    result = recover(virtual_farm.adb_server, dev.serial, QUICK, probe_device=counted,
                     reboot=lambda *a: pytest.fail("a healthy device was rebooted"))
    assert result.verdict == HEALTHY and result.rungs == () and len(looks) == 1
    assert looks[0] == Health(True, True, True, "answering, booted")


def test_a_device_that_drops_off_and_returns_is_recovered_by_waiting(virtual_farm):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    virtual_farm.kill(dev.serial)  # off the bus, as a phone whose USB link reset is
    back = threading.Timer(2.0, lambda: virtual_farm.restart(dev.serial))
    back.start()
    try:
        rungs = []
        result = recover(virtual_farm.adb_server, dev.serial, QUICK, on_rung=rungs.append,
                         reboot=lambda *a: pytest.fail("a returning device was rebooted"))
    finally:
        back.join()
    assert not result.before.listed, result.before
    assert result.verdict == RECOVERED and _names(result) == [("return", True)], result.describe()
    assert rungs == list(result.rungs)  # each rung told as it ended
    assert result.rungs[0].seconds >= 1.0  # it did wait for the device to come back


def test_a_device_still_booting_is_recovered_by_waiting_for_the_boot(virtual_farm):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    virtual_farm.set_faults(dev.serial, boot_completed_delay_ms=3000)
    virtual_farm.reboot(dev.serial)  # back on its server, sys.boot_completed not yet set
    result = recover(virtual_farm.adb_server, dev.serial, QUICK,
                     reboot=lambda *a: pytest.fail("a booting device was rebooted"))
    assert result.before.listed and result.before.answers and not result.before.booted, result.before
    assert "still booting" in result.before.detail
    assert result.verdict == RECOVERED, result.describe()
    assert _names(result) == [("return", True), ("boot", True)], result.describe()


def test_a_wedged_shell_is_recovered_by_the_reboot_rung(virtual_farm):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    virtual_farm.set_faults(dev.serial, hang_until_reboot=True)
    ladder = RecoveryConfig(return_timeout_s=1, boot_timeout_s=1, reboot_timeout_s=60, probe_timeout_s=1)
    result = recover(virtual_farm.adb_server, dev.serial, ladder)
    assert result.before.listed and not result.before.answers, result.before
    assert "did not finish in 1 s" in result.before.detail  # the probe's own bound, named
    assert result.verdict == RECOVERED, result.describe()
    assert _names(result) == [("return", False), ("boot", False), ("reboot", True)], result.describe()
    assert not read_faults(dev.root).hang_until_reboot  # the reboot is what cured it
    assert "not within 1s" in result.rungs[0].detail and "reboot: ok" in result.describe()


def test_a_wedged_device_beyond_the_configured_rungs_fails_the_ladder(virtual_farm):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    virtual_farm.set_faults(dev.serial, hang_until_reboot=True)
    ladder = RecoveryConfig(rungs=("return", "boot"), return_timeout_s=1, boot_timeout_s=1,
                            probe_timeout_s=1)
    started = time.monotonic()
    result = recover(virtual_farm.adb_server, dev.serial, ladder)
    assert result.verdict == FAILED and _names(result) == [("return", False), ("boot", False)]
    assert time.monotonic() - started < 15  # the rungs' bounds, and a probe's each
    assert read_faults(dev.root).hang_until_reboot  # nothing rebooted it


def test_a_device_that_never_returns_is_absent_and_no_reboot_is_tried(virtual_farm):
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    virtual_farm.kill(dev.serial)
    ladder = RecoveryConfig(return_timeout_s=1.5, boot_timeout_s=30, reboot_timeout_s=30, probe_timeout_s=1)
    started = time.monotonic()
    result = recover(virtual_farm.adb_server, dev.serial, ladder,
                     reboot=lambda *a: pytest.fail("an absent device was rebooted"))
    assert result.verdict == ABSENT and _names(result) == [("return", False)], result.describe()
    assert time.monotonic() - started < 10  # the boot rung's 30 s were not waited for


def test_a_reboot_that_brings_nothing_back_fails(virtual_farm):
    """The reboot rung's wait is bounded: a device that went down and stays down fails the ladder
    (it was there, so it is not merely absent)."""
    (dev,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    virtual_farm.set_faults(dev.serial, hang_until_reboot=True)
    ladder = RecoveryConfig(rungs=("reboot",), reboot_timeout_s=2, probe_timeout_s=1)
    result = recover(virtual_farm.adb_server, dev.serial, ladder,
                     reboot=lambda server, serial: virtual_farm.kill(serial))
    assert result.verdict == FAILED and _names(result) == [("reboot", False)], result.describe()
    assert "not within 2s" in result.rungs[0].detail


# -- the ladder's own logic, on scripted looks -------------------------------------------------------

class _Script:
    """Looks that follow a script: each entry is (listed, answers, booted), the last repeats."""

    def __init__(self, *looks: tuple[bool, bool, bool]):
        self.looks = list(looks)
        self.reboots = 0

    def __call__(self, server, serial) -> Health:
        listed, answers, booted = self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]
        return Health(listed, answers, booted, f"look {listed}/{answers}/{booted}")

    def reboot(self, server, serial) -> None:
        self.reboots += 1


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += max(s, 0.01)


def _scripted(script: _Script, config: RecoveryConfig = RecoveryConfig()):
    clock = _Clock()
    return recover(None, "S1", config, probe_device=script, reboot=script.reboot, clock=clock,
                   sleep=clock.sleep), clock


def test_a_server_that_goes_down_ends_the_ladder_without_blame():
    looks = iter([Health(True, False, False, "shell did not answer"),
                  Health(False, False, False, "adb server down", server_down=True)])
    clock = _Clock()
    result = recover(None, "S1", RecoveryConfig(), probe_device=lambda *a: next(looks),
                     reboot=lambda *a: pytest.fail("rebooted behind a dead server"),
                     clock=clock, sleep=clock.sleep)
    assert result.verdict == recovery.SERVER_DOWN and _names(result) == [("return", False)]


def test_no_rungs_means_no_wait_and_a_failed_verdict_for_a_broken_device():
    script = _Script((True, False, False))
    result, clock = _scripted(script, RecoveryConfig(rungs=()))
    assert result.verdict == FAILED and result.rungs == () and clock.now == 0 and script.reboots == 0


def test_each_rung_waits_its_own_bound_and_the_reboot_comes_last():
    script = _Script((True, False, False))  # never answers
    result, clock = _scripted(script, RecoveryConfig(return_timeout_s=60, boot_timeout_s=120,
                                                     reboot_timeout_s=300))
    assert _names(result) == [("return", False), ("boot", False), ("reboot", False)]
    assert [round(r.seconds) for r in result.rungs] == [60, 120, 300]
    assert script.reboots == 1 and result.verdict == FAILED


def test_a_device_that_answers_but_never_boots_is_rebooted_once():
    script = _Script((True, True, False), (True, True, False), (True, True, False), (True, True, True))
    result, _ = _scripted(script, RecoveryConfig(rungs=("reboot",)))
    assert script.reboots == 1 and result.verdict == RECOVERED


@pytest.mark.parametrize("rungs, problem", [
    (("reboot", "return"), "in the order return, boot, reboot"),
    (("boot", "boot"), "each at most once"),
    (("wait",), "known rungs are return, boot, reboot"),
])
def test_rungs_out_of_order_repeated_or_unknown_are_refused(rungs, problem):
    with pytest.raises(UsageError, match=problem):
        RecoveryConfig(rungs=rungs)


def test_a_virtual_device_waits_seconds_where_a_phone_waits_minutes():
    capped = recovery.for_virtual(RecoveryConfig(rungs=("boot", "reboot"), boot_timeout_s=4))
    assert capped.rungs == ("boot", "reboot") and capped.boot_timeout_s == 4  # shorter stays
    assert capped.return_timeout_s == 5 and capped.reboot_timeout_s == 30 and capped.probe_timeout_s == 3
