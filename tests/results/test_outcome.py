"""How the plugin judges what a farm test raised (farm.results.outcome): an infrastructure error or a
bad input is an error, never a failure; only an infrastructure error is re-run; and only a device's own
trouble counts toward its quarantine."""

from __future__ import annotations

import pytest

from farm.db.base import PoolLost
from farm.errors import (
    AdbError,
    AdbServerDown,
    DeviceGone,
    DeviceTimeout,
    FarmError,
    InfraError,
    LeaseError,
    LeaseLost,
    LeaseTimeout,
    PoolError,
    RunIncomplete,
    UsageError,
)
from farm.results.outcome import (
    blames_device,
    classify,
    failed_on,
    pool_lost,
    pool_lost_stop,
    rerun_policy,
    stopped_by_pool_loss,
)
from farm.vocab import ErrorKind

# Every kind of exception a farm test meets: (exception, its kind, whether its device is to blame).
JUDGED = [
    (DeviceGone("dev0 vanished", serial="dev0"), ErrorKind.INFRA, True),
    (DeviceTimeout("shell timed out", serial="dev0"), ErrorKind.INFRA, True),
    (AdbError("transport reset", serial="dev0"), ErrorKind.INFRA, True),
    (RunIncomplete("no outputs.txt", serial="dev0"), ErrorKind.INFRA, True),
    (InfraError("something broke", serial="dev0"), ErrorKind.INFRA, True),
    # The pool, a lease or an adb server failing says nothing about the device it happened on.
    (PoolError("database down"), ErrorKind.INFRA, False),
    (LeaseTimeout("no SM8650 within 600s"), ErrorKind.INFRA, False),
    (LeaseLost("lease on dev0 lost", serial="dev0"), ErrorKind.INFRA, False),
    (AdbServerDown("127.0.0.1:5037 refused", serial="dev0", server="127.0.0.1:5037"), ErrorKind.INFRA, False),
    (UsageError("cases.json: no field 'prompt'"), ErrorKind.USAGE, False),
    (LeaseError("cannot release: stale token"), ErrorKind.USAGE, False),
    # Everything else is the code under test: a failure.
    (AssertionError("tokens differ at 3"), None, False),
    (RuntimeError("runner crashed"), None, False),
    (FarmError("neither family"), None, False),
    (KeyboardInterrupt(), None, False),
]
IDS = [type(exc).__name__ for exc, _, _ in JUDGED]


@pytest.mark.parametrize(("exc", "kind", "blamed"), JUDGED, ids=IDS)
def test_an_exception_is_an_infra_error_a_usage_error_or_a_failure(exc, kind, blamed):
    assert classify(exc) is kind


@pytest.mark.parametrize(("exc", "kind", "blamed"), JUDGED, ids=IDS)
def test_only_a_devices_own_infra_errors_count_toward_its_quarantine(exc, kind, blamed):
    assert blames_device(exc) is blamed


@pytest.mark.parametrize(("exc", "leased", "device"), [
    (DeviceGone("gone", serial="dev1"), "dev0", "dev1"),   # the error names where it happened
    (DeviceGone("gone"), "dev0", "dev0"),                   # else: the device the test leased
    (DeviceGone("gone", serial=""), "dev0", "dev0"),
    (PoolError("down"), None, None),                        # before any lease: no device
    (RuntimeError("no serial attribute"), "dev0", "dev0"),
])
def test_an_infra_error_happened_on_the_device_it_names_else_on_the_lease(exc, leased, device):
    assert failed_on(exc, leased) == device


@pytest.mark.parametrize("retries", [0, -1])
def test_no_reruns_when_retries_are_off(retries):
    assert rerun_policy(retries, 5.0) is None


def test_a_farm_test_is_rerun_up_to_its_retries_only_after_an_infra_error():
    policy = rerun_policy(1, 2.5)
    assert policy is not None
    assert policy == {"reruns": 1, "reruns_delay": 2.5, "only_rerun": [InfraError],
                      "rerun_except": [PoolLost]}
    only = tuple(policy["only_rerun"])
    assert all(isinstance(exc, only) for exc, kind, _ in JUDGED if kind is ErrorKind.INFRA)
    assert not any(isinstance(exc, only) for exc, kind, _ in JUDGED if kind is not ErrorKind.INFRA)



@pytest.mark.timeout(10)
def test_an_exception_chain_that_loops_is_walked_once_and_ends():
    # An exception raised while handling one that it caused loops its chain (a.__context__ is b,
    # b.__cause__ is a): the walk must end, with no PoolLost found where there is none.
    a, b = LeaseError("lease on dev0 ended"), InfraError("device dev0 gone", serial="dev0")
    a.__context__, b.__cause__ = b, a
    assert pool_lost(a) is None and pool_lost(b) is None
    gone = PoolLost("pool sqlite:///p.db: deleted")
    gone.__context__, a.__cause__ = a, gone  # and one that loops through it is still found
    assert pool_lost(b) is gone


def test_a_lost_pool_is_found_behind_the_lease_it_ended():
    """The heartbeat turns PoolLost into the lease's loss, and the test's hold into LeaseLost: the
    plugin still sees that the pool itself is gone (every later test would meet it) and stops."""
    gone = PoolLost("pool sqlite:///p.db: the database file p.db was deleted")
    lost = LeaseError(str(gone))
    lost.__cause__ = gone
    try:
        try:
            raise lost
        except LeaseError as e:
            raise LeaseLost("lease on dev0 ended before the test did", serial="dev0") from e
    except LeaseLost as e:
        assert pool_lost(e) is gone
    assert pool_lost(gone) is gone
    assert pool_lost(LeaseLost("lease taken away", serial="dev0")) is None
    assert pool_lost(PoolError("database is locked")) is None  # an outage: waited out, not a stop
    assert pool_lost(None) is None
    reason = pool_lost_stop(gone)
    assert stopped_by_pool_loss(reason) == str(gone)
    assert stopped_by_pool_loss("KeyboardInterrupt") is None
