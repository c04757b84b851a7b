"""How an exception a farm test raised is judged: the decisions the pytest plugin applies to a report.

- ``classify``: an ``InfraError`` is an infrastructure error, a ``UsageError`` a bad-input error (both
  reported as pytest *errors*, never failures); anything else (an assertion, a crashing runner) is a
  test failure (None).
- ``failed_on`` and ``blames_device``: which device an infrastructure error happened on, and whether
  it counts toward that device's quarantine (the pool, a lease or an adb server failing says nothing
  about the device).
- ``rerun_policy``: how a farm test is re-run (pytest-rerunfailures' ``flaky`` marker): only after an
  infrastructure error, never after a failure or a bad input, and never once the pool is gone.
- ``pool_lost``: whether an error comes from the pool itself being gone (deleted, replaced, dropped):
  every later test would meet it, so the run stops there (``pool_lost_stop``).

Plain functions of the exception, so that they are tested (and mutation-tested) without running pytest.
"""

from __future__ import annotations

from typing import Any

from farm.db.base import PoolLost
from farm.errors import AdbServerDown, InfraError, LeaseLost, LeaseTimeout, PoolError, UsageError
from farm.vocab import ErrorKind

# Errors that say nothing about the device they happened on: not counted toward its quarantine.
NOT_THE_DEVICES_FAULT: tuple[type[InfraError], ...] = (PoolError, LeaseTimeout, LeaseLost, AdbServerDown)
# The only errors after which a farm test runs again (on another device of its SoC).
RERUN_ONLY_ON: tuple[type[Exception], ...] = (InfraError,)
# Infrastructure errors that no re-run can mend.
RERUN_NEVER_ON: tuple[type[Exception], ...] = (PoolLost,)
# How a run stopped by a lost pool says so (pytest's Interrupted carries it from an xdist worker).
POOL_LOST_STOP = "ptefarm: the pool is lost, the run stops"


def classify(exc: BaseException) -> ErrorKind | None:
    """Why a test that raised ``exc`` has no verdict (an error), or None: it failed."""
    if isinstance(exc, InfraError):
        return ErrorKind.INFRA
    if isinstance(exc, UsageError):
        return ErrorKind.USAGE
    return None


def failed_on(exc: BaseException, leased: str | None) -> str | None:
    """The device an infrastructure error happened on: the one it names, else the test's lease."""
    return getattr(exc, "serial", None) or leased


def blames_device(exc: BaseException) -> bool:
    """Whether ``exc`` counts as an infrastructure failure of the device it happened on."""
    return isinstance(exc, InfraError) and not isinstance(exc, NOT_THE_DEVICES_FAULT)


def rerun_policy(retries: int, delay_s: float) -> dict[str, Any] | None:
    """The ``pytest.mark.flaky`` arguments of a farm test: up to ``retries`` re-runs ``delay_s`` apart,
    only after an infrastructure error. None: re-runs are off (``retries`` <= 0)."""
    if retries <= 0:
        return None
    return {"reruns": retries, "reruns_delay": delay_s, "only_rerun": list(RERUN_ONLY_ON),
            "rerun_except": list(RERUN_NEVER_ON)}


def pool_lost(exc: BaseException | None) -> PoolLost | None:
    """The PoolLost behind ``exc`` (itself, or what caused it: a lease its heartbeat found gone with
    its pool), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, PoolLost):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def pool_lost_stop(lost: PoolLost) -> str:
    """What a run stopped by ``lost`` gives pytest as its reason to stop (``session.shouldstop``)."""
    return f"{POOL_LOST_STOP}: {lost}"


def stopped_by_pool_loss(reason: str) -> str | None:
    """The pool's loss a stop reason names (from ``pool_lost_stop``), or None: not such a stop."""
    prefix = f"{POOL_LOST_STOP}: "
    return reason[len(prefix):] if reason.startswith(prefix) else None
