"""What the ``farm`` commands show while they work, at a terminal and in a CI log.

The library reports progress through callbacks (``export_bundle(on_step=)``, ``deploy(on_plan=,
on_progress=)``, ``Pool.acquire(on_wait=)``) and prints nothing; the commands decide here how it looks:

- at a terminal: one live line (a bar for pushes), replaced as it changes;
- not a terminal (CI logs, pipes): plain lines, never wrapped, cut or padded to 80 columns, and few of
  them (a lease wait says who holds the devices when that changes, or every ``LOG_EVERY_S``).

``console()`` is the one way the commands make a rich Console: rich sizes a console that is not a
terminal to 80 columns, which cut table cells ("SM-S…") and broke long paths mid-name in CI logs.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console

from farm.pool.model import PRIORITIES, LeaseRequest, PoolStatus

UNWRAPPED_WIDTH = 100_000  # rich needs a width: one no line of ours reaches
LOG_EVERY_S = 30.0  # a lease wait in a log repeats an unchanged line this rarely
FIRST_AFTER_S = 1.0  # a lease granted within this long says nothing about waiting


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or a stream without a file descriptor
        return False


def console(stderr: bool = False) -> Console:
    """A Console for tables and messages: the terminal's width at a terminal; elsewhere unbounded
    lines with no colour and no soft wrapping, so that every serial and path stays whole."""
    stream = sys.stderr if stderr else sys.stdout
    if is_terminal(stream):
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=UNWRAPPED_WIDTH, no_color=True, highlight=False,
                   soft_wrap=True)


def _priority_name(priority: int) -> str:
    return next((name for name, value in PRIORITIES.items() if value == priority), str(priority))


def describe_wait(status: PoolStatus, request: LeaseRequest, waited_s: float) -> str:
    """``waiting 40 s for SoC SM8650: both held by alice@ci-3 (pr, 95 s)``: what the matching
    devices are doing, holders grouped (user@host, their priority, the longest they have held)."""
    matching = [d for d in status.devices if request.matches(d.device) and d.device.present]
    wanted = request.describe().rpartition(" (priority ")[0]  # our own priority says nothing here
    head = f"waiting {waited_s:.0f} s for {wanted}"
    if not matching:
        return f"{head}: no device in the pool matches yet"
    holders: dict[str, tuple[int, float, int]] = {}  # who -> (devices, longest held, priority)
    others: dict[str, int] = {}  # state -> devices not leased
    for d in matching:
        if d.lease is None:
            others[d.device.state] = others.get(d.device.state, 0) + 1
            continue
        who = f"{d.lease.holder.user}@{d.lease.holder.host}"
        n, held, _ = holders.get(who, (0, 0.0, d.lease.priority))
        holders[who] = (n + 1, max(held, status.now - d.lease.created), d.lease.priority)
    parts = []
    for who, (n, held, priority) in sorted(holders.items(), key=lambda kv: -kv[1][0]):
        count = ("both" if n == 2 else f"all {n}") if n == len(matching) and n > 1 else \
            ("" if len(matching) == 1 else str(n))
        parts.append(f"{count + ' ' if count else ''}held by {who} ({_priority_name(priority)}, "
                     f"{held:.0f} s)")
    parts += [f"{n} {state}" for state, n in sorted(others.items())]
    return f"{head}: {', '.join(parts)}"


class LeaseWaitReporter:
    """``on_wait`` for ``Pool.acquire``: reads the pool's status (one read, at most every
    ``refresh_s``) and shows ``describe_wait`` on ``stream``: a live line at a terminal, plain lines
    elsewhere when the description changes or every ``LOG_EVERY_S``."""

    def __init__(self, status: Callable[[], PoolStatus], request: LeaseRequest, *,
                 stream: TextIO | None = None, refresh_s: float = 2.0):
        self.status = status
        self.request = request
        self.stream = stream or sys.stderr
        self.refresh_s = refresh_s
        self.live = is_terminal(self.stream)
        self._read_at = float("-inf")
        self._what = ""  # the description without the waited time, to notice a change
        self._logged_at = float("-inf")
        self.shown: list[str] = []

    def __call__(self, waited_s: float) -> None:
        if waited_s < FIRST_AFTER_S:
            return
        now = time.monotonic()
        if now - self._read_at < self.refresh_s:
            return
        self._read_at = now
        try:
            line = describe_wait(self.status(), self.request, waited_s)
        except Exception:  # noqa: BLE001: a display must never end the wait; the lease says more
            return
        # Who holds what, without the times (how long each holder has held it grows every second).
        what = re.sub(r"\b\d+ s\b", "", line.split(": ", 1)[-1])
        if self.live:
            self.stream.write(f"\r\x1b[2K{line}…")
        elif what != self._what or now - self._logged_at >= LOG_EVERY_S:
            self.stream.write(f"farm: {line}\n")
            self._logged_at = now
        else:
            return
        self._what = what
        self.shown.append(line)
        self.stream.flush()

    def done(self) -> None:
        """End the live line (the next message starts on a clean line)."""
        if self.live and self.shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
