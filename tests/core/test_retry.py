"""The bounded retry of a call across a passing outage (farm.retry): the fixtures lease, claim, find
and release devices through it, so a pool or adb server that comes back within the wait costs a
delay, and one that does not is the error it was, raised in time."""

from __future__ import annotations

import logging
import time

import pytest

from farm.errors import AdbServerDown, DeviceGone, PoolError
from farm.retry import retrying


class FakeTime:
    """A clock that moves only when the code under test sleeps: what it waited, and when."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def failing(times: int, error: type[Exception] = PoolError, result: str = "leased"):
    """A call that raises ``error`` (numbered) ``times`` times, then returns ``result``."""
    calls: list[Exception] = []

    def call() -> str:
        if len(calls) < times:
            calls.append(error(f"outage {len(calls) + 1}"))
            raise calls[-1]
        return result

    call.raised = calls  # type: ignore[attr-defined]
    return call


def test_a_call_that_succeeds_is_not_retried():
    t = FakeTime()
    assert retrying(failing(0), PoolError, 10.0, "lease", clock=t.clock, sleep=t.sleep) == "leased"
    assert t.slept == []


@pytest.mark.parametrize(("outages", "slept"), [
    (1, [0.5]),
    (3, [0.5, 1.0, 2.0]),
    (7, [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]),  # doubling, capped at 5 s between tries
])
def test_an_outage_that_ends_within_the_wait_is_a_delay_with_backoff(outages, slept):
    t = FakeTime()
    assert retrying(failing(outages), PoolError, 1000.0, "lease", clock=t.clock, sleep=t.sleep) == "leased"
    assert t.slept == slept


def test_the_first_wait_and_its_cap_are_the_callers():
    t = FakeTime()
    retrying(failing(4, AdbServerDown), AdbServerDown, 1000.0, "claim", delay=1.0, max_delay=1.0,
             clock=t.clock, sleep=t.sleep)
    assert t.slept == [1.0, 1.0, 1.0, 1.0]
    t = FakeTime()
    retrying(failing(4), PoolError, 1000.0, "lease", delay=0.25, max_delay=1.5, clock=t.clock, sleep=t.sleep)
    assert t.slept == [0.25, 0.5, 1.0, 1.5]


@pytest.mark.parametrize(("deadline", "slept", "raised"), [
    (0.0, [], 1),             # already past: one try, no wait
    (0.5, [], 1),             # the first wait would reach the deadline: not made
    (0.6, [0.5], 2),
    (1.5, [0.5], 2),          # the second wait would end exactly at the deadline: not made
    (3.0, [0.5, 1.0], 3),
])
def test_an_outage_that_outlasts_the_deadline_raises_its_last_error_in_time(deadline, slept, raised):
    t = FakeTime()
    call = failing(100)
    with pytest.raises(PoolError) as caught:
        retrying(call, PoolError, deadline, "lease", clock=t.clock, sleep=t.sleep)
    assert t.slept == slept
    assert len(call.raised) == raised
    assert caught.value is call.raised[-1]


def test_an_error_that_is_not_transient_is_raised_at_once():
    t = FakeTime()
    call = failing(5, DeviceGone)
    with pytest.raises(DeviceGone):
        retrying(call, PoolError, 1000.0, "lease", clock=t.clock, sleep=t.sleep)
    assert len(call.raised) == 1 and t.slept == []


def test_several_transient_kinds_may_be_retried():
    t = FakeTime()
    outages = [PoolError("db"), AdbServerDown("adb")]

    def call() -> str:
        if outages:
            raise outages.pop(0)
        return "ok"

    assert retrying(call, (PoolError, AdbServerDown), 1000.0, "claim", clock=t.clock, sleep=t.sleep) == "ok"
    assert t.slept == [0.5, 1.0]


def test_each_retry_is_logged_with_the_error_what_is_retried_and_the_wait(caplog):
    t = FakeTime()
    with caplog.at_level(logging.WARNING, logger="farm.retry"):
        retrying(failing(2), PoolError, 1000.0, "lease a SM8650", clock=t.clock, sleep=t.sleep)
    assert [r.getMessage() for r in caplog.records] == [
        "PoolError (outage 1); retrying to lease a SM8650 in 0.5s",
        "PoolError (outage 2); retrying to lease a SM8650 in 1.0s",
    ]


def test_by_default_it_waits_on_the_real_clock():
    call = failing(1)
    assert retrying(call, PoolError, time.monotonic() + 60, "lease", delay=0.001) == "leased"
    with pytest.raises(PoolError):
        retrying(failing(1), PoolError, time.monotonic() - 1, "lease")


def test_a_fatal_kind_of_a_transient_error_is_raised_at_once():
    """A pool that is gone (PoolLost, a PoolError) is not an outage: no wait can mend it."""
    from farm.db.base import PoolLost

    t = FakeTime()
    calls = []

    def call() -> str:
        calls.append(1)
        raise PoolLost("the database file was deleted")

    with pytest.raises(PoolLost):
        retrying(call, PoolError, 1000.0, "lease", clock=t.clock, sleep=t.sleep, fatal=PoolLost)
    assert (calls, t.slept) == ([1], [])
    assert retrying(failing(2), PoolError, 1000.0, "lease", clock=t.clock, sleep=t.sleep,
                    fatal=PoolLost) == "leased"  # a plain outage is still waited out
