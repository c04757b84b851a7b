"""Rows <-> records, and the two writes every state change goes through: set a device's state and
append to the event log, always in the same transaction."""

from __future__ import annotations

import json
from typing import Any

from farm.db.base import Txn
from farm.errors import PoolError
from farm.pool.model import (
    AVAILABLE,
    LEASED,
    OFFLINE,
    DeviceRecord,
    Event,
    Holder,
    LeaseInfo,
    LeaseRequest,
    QueueEntry,
)
from farm.vocab import EventKind


def tags_of_row(row: dict[str, Any], *sources: str) -> tuple[str, ...]:
    """The union of a device row's tag columns (default: all three sources)."""
    tags: set[str] = set()
    for column in sources or ("tags", "config_tags", "admin_tags"):
        tags.update(json.loads(row.get(column) or "[]"))
    return tuple(sorted(tags))


def device_from_row(row: dict[str, Any]) -> DeviceRecord:
    return DeviceRecord(serial=row["serial"], server=row["server"], soc=row["soc"],
                        htp_arch=row["htp_arch"], model=row["model"], virtual=bool(row["virtual"]),
                        tags=tags_of_row(row), state=row["state"], reason=row["reason"],
                        present=bool(row["present"]), infra_failures=int(row["infra_failures"]),
                        last_seen=row.get("last_seen"))


def holder_from_row(row: dict[str, Any]) -> Holder:
    return Holder(user=row["holder_user"], host=row["holder_host"], pid=int(row["holder_pid"]),
                  ci_job=row["holder_ci_job"], purpose=row["purpose"])


def holder_params(holder: Holder) -> tuple:
    return (holder.user, holder.host, holder.pid, holder.ci_job, holder.purpose)


def lease_from_row(row: dict[str, Any]) -> LeaseInfo:
    return LeaseInfo(token=row["token"], serial=row["serial"], holder=holder_from_row(row),
                     priority=int(row["priority"]), created=row["created"], renewed=row["renewed"],
                     expires=row["expires"], ended=row["ended"], end_reason=row["end_reason"])


def queue_from_row(row: dict[str, Any]) -> QueueEntry:
    return QueueEntry(id=int(row["id"]), request=LeaseRequest.from_json(row["request"]),
                      holder=holder_from_row(row), ttl=row["ttl"], enqueued=row["enqueued"],
                      polled=row["polled"])


def event_from_row(row: dict[str, Any]) -> Event:
    return Event(id=int(row["id"]), at=row["at"], kind=row["kind"], serial=row["serial"],
                 from_state=row["from_state"], to_state=row["to_state"], token=row["token"],
                 queue_id=None if row["queue_id"] is None else int(row["queue_id"]),
                 holder=row["holder"], detail=row["detail"])


def log_event(txn: Txn, kind: str, *, serial: str | None = None, from_state: str | None = None,
              to_state: str | None = None, token: str | None = None, queue_id: int | None = None,
              holder: str = "", detail: str = "") -> None:
    txn.run("INSERT INTO events (at, kind, serial, from_state, to_state, token, queue_id, holder, "
            "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (txn.now, kind, serial, from_state, to_state, token, queue_id, holder, detail))


def set_state(txn: Txn, serial: str, old: str, new: str, reason: str | None = None) -> None:
    """Change a device's state from ``old`` (the caller logs the event that explains why). Writes are
    serialized, so a device in another state than its caller read is a bug of ours: refused, and the
    transaction with it, rather than a state machine that skips a step (a leased device made
    available under its holder)."""
    if not change_state(txn, serial, old, new, reason):
        row = txn.one("SELECT state FROM devices WHERE serial = ?", (serial,))
        raise PoolError(f"device {serial}: cannot go from {old} to {new}: it is "
                        f"{row['state'] if row else 'not in the pool'}; nothing was changed")


def change_state(txn: Txn, serial: str, old: str, new: str, reason: str | None = None) -> bool:
    """Change a device's state if it is ``old``; whether it was."""
    # RETURNING, not the row count: PostgreSQL's pipeline mode knows no count before its results.
    if reason is None:
        changed = txn.one("UPDATE devices SET state = ?, state_since = ? WHERE serial = ? AND state = ? "
                          "RETURNING serial", (new, txn.now, serial, old))
    else:
        changed = txn.one("UPDATE devices SET state = ?, reason = ?, state_since = ? "
                          "WHERE serial = ? AND state = ? RETURNING serial",
                          (new, reason, txn.now, serial, old))
    if changed is not None and new == AVAILABLE:
        txn.freed_serials.add(serial)
    return changed is not None


def has_live_lease(txn: Txn, serial: str) -> bool:
    return txn.one("SELECT token FROM leases WHERE serial = ? AND ended IS NULL", (serial,)) is not None


def settled_state(txn: Txn, serial: str, present: bool) -> str:
    """The state a device returns to when nothing administrative holds it: offline if it is not
    attached, leased if a live lease exists, else available."""
    if not present:
        return OFFLINE
    return LEASED if has_live_lease(txn, serial) else AVAILABLE


def end_lease(txn: Txn, lease: dict[str, Any], reason: str) -> None:
    """End a live lease (released or expired); the device becomes available unless it is quarantined or
    offline, which outlive the lease."""
    txn.run("UPDATE leases SET ended = ?, end_reason = ? WHERE token = ?",
            (txn.now, reason, lease["token"]))
    # Leased, as it usually is: one statement frees it. Otherwise (quarantined or offline while
    # leased, which outlive the lease) its state is read for the event and left as it is. (On
    # PostgreSQL each statement whose answer is awaited is a round trip under the pool lock.)
    if change_state(txn, lease["serial"], LEASED, AVAILABLE):
        old, new = LEASED, AVAILABLE
    else:
        dev = txn.one("SELECT state FROM devices WHERE serial = ?", (lease["serial"],))
        old = new = dev["state"] if dev else None
    log_event(txn, reason, serial=lease["serial"], from_state=old, to_state=new,
              token=lease["token"], holder=holder_from_row(lease).describe(),
              detail=f"lease created {lease['created']:.3f}, expires {lease['expires']:.3f}")


def reclaim_expired(txn: Txn) -> int:
    """End every lease whose TTL ran out; done at the start of each acquire, renew and release."""
    expired = txn.all("SELECT * FROM leases WHERE ended IS NULL AND expires < ?", (txn.now,))
    for lease in expired:
        end_lease(txn, lease, EventKind.EXPIRED)
    return len(expired)


def token_problem(txn: Txn, token: str, row: dict[str, Any] | None, serial: str | None = None) -> str:
    """Why ``token`` holds no lease (``row``: its leases row, None when the pool has none).

    For the pool's own refusals (renew, release) the whole story: when the lease ended, why an expired
    one did, and who holds its device now. Asked on behalf of ``serial`` (a holder about to act on that
    device, whose caller says who holds it now: ``farm run --lease``), the short one: unknown, another
    device's, or how it ended."""
    if serial is not None:
        if row is None:
            return f"lease {token[:8]} is unknown to this pool"
        if row["serial"] != serial:
            return f"lease {token[:8]} is for {row['serial']}, not {serial}"
        # How it ended is its last event; a lease still live (granted since the caller looked) has
        # only been leased.
        return f"lease {token[:8]} ended ({row['end_reason'] if row['ended'] is not None else 'leased'})"
    if row is None:
        return f"lease token {token!r} is unknown to this pool (mistyped, or another pool's)"
    text = f"lease {token} on {row['serial']} was {row['end_reason']} {txn.now - row['ended']:.1f}s ago"
    if row["end_reason"] == EventKind.EXPIRED:
        text += (f" (not renewed within its TTL of {row['expires'] - row['renewed']:g}s: "
                 f"holder stalled or died)")
    current = txn.one("SELECT * FROM leases WHERE serial = ? AND ended IS NULL", (row["serial"],))
    if current is not None:
        text += f"; {row['serial']} is now held by {lease_from_row(current).holder.describe()}"
    return text
