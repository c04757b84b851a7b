"""Bounded retry of a call that may meet a passing outage (a pool database or an adb server that
comes back): an outage that ends within the wait is a delay, not an error."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def retrying(call: Callable[[], T], transient: type[Exception] | tuple[type[Exception], ...],
             deadline: float, what: str, *, delay: float = 0.5, max_delay: float = 5.0,
             clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep,
             fatal: type[Exception] | tuple[type[Exception], ...] = ()) -> T:
    """``call()``, retried while it raises ``transient``, waiting ``delay`` (doubling up to
    ``max_delay``) between tries, until ``deadline`` (on ``clock``): a try whose wait would reach the
    deadline is not made, and the last error is raised. Any other error is raised at once, and so is
    one of ``fatal``, a kind of ``transient`` that no wait can mend (a pool that is gone, not down).
    ``what`` says what is being done, for the log line of each retry."""
    while True:
        try:
            return call()
        except transient as e:
            if isinstance(e, fatal) or clock() + delay >= deadline:
                raise
            log.warning("%s (%s); retrying to %s in %.1fs", type(e).__name__, e, what, delay)
            sleep(delay)
            delay = min(delay * 2, max_delay)
