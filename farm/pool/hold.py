"""Holding a lease: what every holder does between getting a lease and giving it back.

Three holders: a test's ``device`` fixture (it acquired the lease), ``farm deploy``/``farm run
--lease`` (another process took it: ``adopt``), and ``farm pool exec`` (it acquired the lease for a
command). Each keeps its lease alive with the heartbeat for as long as it uses the device, fences the
device before acting on it (farm.device.fence: from then on the device refuses any other lease's
commands), stops the heartbeat when done, and gives the lease back if it is its own:

    with hold(lease, release=give_back, outlive="the test") as held:
        device = held.claim(adb)
        ...

A lease that ended under its holder (the heartbeat was refused, or so was the release) is
``Held.lost``; with ``outlive`` it is a ``LeaseLost`` on the way out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from farm.device.fence import FencedDevice
from farm.errors import LeaseError, LeaseLost
from farm.pool.leases import Lease, Pool, fence_margin
from farm.pool.rows import device_from_row, lease_from_row, token_problem


def adopt(pool: Pool, token: str, serial: str) -> Lease:
    """The Lease of ``token`` on ``serial``, taken by another process (``farm pool lease`` printed
    the token, ``farm pool exec`` passed it on), for this one to act on the device. Its fence
    deadline counts from before this read, as an acquired lease's does: the pool cannot have ended
    the lease before then. LeaseError (``token_problem``'s short story) if the token holds no live
    lease on ``serial``."""
    started = pool.clock.now()
    with pool.store.read() as txn:  # one round trip for both, and the clock
        leases, devices = txn.all_of(("SELECT * FROM leases WHERE token = ?", (token,)),
                                     ("SELECT * FROM devices WHERE serial = ?", (serial,)))
        row = leases[0] if leases else None
        if row is not None and row["ended"] is None and row["serial"] == serial and devices:
            ttl = row["expires"] - row["renewed"]
            return Lease(pool, lease_from_row(row), device_from_row(devices[0]), ttl,
                         valid_until=started + (row["expires"] - txn.now) - fence_margin(ttl))
        problem = token_problem(txn, token, row, serial)
    raise LeaseError(problem)


@dataclass
class Held:
    """A lease while it is held (see ``hold``)."""

    lease: Lease
    refused: LeaseError | None = None  # the release's: the lease had ended before we gave it back

    @property
    def lost(self) -> LeaseError | None:
        """Why the lease ended under us (None: as far as we know, it did not)."""
        return self.lease.lost or self.refused

    def claim(self, device: Any, *, retry: Callable[[Callable[[], None]], object] | None = None,
              unless_ours: bool = False) -> FencedDevice:
        """``device`` fenced for this lease, its fence claimed: from now on the device refuses any
        other lease's commands. ``retry(claim)`` runs the claim (e.g. through an adb server restart;
        a claim is idempotent). ``unless_ours``: a fence that names this lease already is left as it
        is (``farm run`` after ``farm deploy`` with one lease claims once)."""
        fenced = FencedDevice(device, self.lease)
        if not (unless_ours and fenced.holds()):
            if retry is None:
                fenced.claim()
            else:
                retry(fenced.claim)
        return fenced


@contextmanager
def hold(lease: Lease, *, release: Callable[[Lease], object] | None = None,
         outlive: str | None = None) -> Iterator[Held]:
    """Hold ``lease`` for the block: its heartbeat renews it (a block longer than the TTL keeps it)
    and ``Held.claim`` fences its device. On the way out the heartbeat stops, then ``release(lease)``
    gives the lease back (None: it is not ours to end, e.g. an adopted one); a LeaseError from it
    means the lease had already ended, other errors are the caller's to handle in ``release``.

    ``outlive``: what the lease must have outlived ("the test"). A lease lost before the block ended
    then raises LeaseLost after it: what was done under it is not trusted. Without it the loss is
    only ``Held.lost``, and an action after it is stopped by the fence (``Lease.check``) anyway. An
    error raised by the block is never replaced by the loss."""
    held = Held(lease)
    lease.start_heartbeat()
    try:
        yield held
    finally:
        lease.stop_heartbeat()
        if release is not None:
            try:
                release(lease)
            except LeaseError as e:
                held.refused = e
    if outlive is not None and held.lost is not None:
        raise LeaseLost(f"lease on {lease.serial} ended before {outlive} did ({held.lost}): its "
                        f"result is not trusted", serial=lease.serial) from held.lost
