"""Device health: discovery results, infra-failure counting and quarantine.

A device that fails for infrastructure reasons N times in a row (a push times out, a command fails)
leaves the pool as "quarantined" with the reason, until someone runs ``farm pool restore``; failures
within a short window of the last counted one are one incident and count once, and a success resets
the count. Discovery marks devices that vanished from their adb server "offline" (not failing: their
count is reset) and returns them when they reappear. Quarantine
and offline outlive a lease: the holder keeps its lease, nobody new gets the device.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from farm.config import tag_problem
from farm.db.base import Txn
from farm.errors import UsageError
from farm.pool.model import AVAILABLE, LEASED, OFFLINE, QUARANTINED, DeviceRecord, Holder, SyncReport
from farm.pool.rows import (
    change_state,
    has_live_lease,
    holder_params,
    log_event,
    set_state,
    settled_state,
    tags_of_row,
)
from farm.vocab import EventKind

if TYPE_CHECKING:
    from farm.device.probe import DeviceInfo

log = logging.getLogger(__name__)


def _device_row(txn: Txn, serial: str) -> dict[str, Any]:
    row = txn.one("SELECT * FROM devices WHERE serial = ?", (serial,))
    if row is None:
        raise UsageError(f"device {serial}: not in the pool (run 'farm pool sync' or check the serial)")
    return row


def sync(txn: Txn, infos: Iterable[DeviceInfo], servers: Iterable[str] | None,
         config_tags: Mapping[str, Iterable[str]] | None = None, *,
         hold_s: float | None = None) -> SyncReport:
    """Make the pool agree with a discovery result.

    ``servers``: the adb servers that were scanned ("host:port"); only their devices can vanish, so a
    host that syncs its own servers leaves other hosts' devices alone. None means every server.
    ``config_tags``: serial -> tags from the farm config, applied to every device found (one the
    config no longer names loses them); None leaves the config tags in the pool as they are.
    ``hold_s``: an available device whose fence names a lease this pool never granted is held back
    that long (see ``hold_fenced_elsewhere``); None: not held.
    """
    pairs = []
    unusable: dict[str, str] = {}  # serial -> why adb cannot use it (offline, unauthorized, probe error)
    for info in infos:
        rec = DeviceRecord.from_info(info)
        adb_state = info.state or "device"
        if adb_state != "device":
            unusable[rec.serial] = f"adb state '{adb_state}' on {rec.server}" + \
                (f": {info.error}" if info.error else "")
        pairs.append((rec, info))
    seen: dict[str, DeviceRecord] = {}
    for rec, _ in pairs:
        if rec.serial in seen and seen[rec.serial].server != rec.server:
            raise UsageError(f"device {rec.serial}: reported by two adb servers "
                             f"({seen[rec.serial].server} and {rec.server}); serials must be unique")
        seen[rec.serial] = rec
    scanned = None if servers is None else {str(s) for s in servers}
    report = SyncReport()
    existing = {r["serial"]: r for r in txn.all("SELECT * FROM devices")}
    for rec, info in pairs:
        row = existing.get(rec.serial)
        if rec.serial in unusable:
            _mark_unusable(txn, rec, row, unusable[rec.serial], report)
            continue
        attrs = (rec.server, rec.soc, rec.htp_arch, rec.model, int(rec.virtual), json.dumps(list(rec.tags)),
                 json.dumps(info.to_dict(), sort_keys=True, default=str))
        if row is None:
            txn.run("INSERT INTO devices (server, soc, htp_arch, model, virtual, tags, attrs, serial, "
                    "state, first_seen, last_seen, state_since) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'available', ?, ?, ?)",
                    (*attrs, rec.serial, txn.now, txn.now, txn.now))
            log_event(txn, EventKind.ADDED, serial=rec.serial, to_state="available", detail=rec.describe())
            txn.freed = True
            report.added.append(rec.serial)
            if hold_s is not None and info.fence:
                hold_fenced_elsewhere(txn, rec.serial, info.fence, hold_s)
            continue
        old_attrs = (row["server"], row["soc"], row["htp_arch"], row["model"], int(row["virtual"]),
                     row["tags"], row["attrs"])
        txn.run("UPDATE devices SET server = ?, soc = ?, htp_arch = ?, model = ?, virtual = ?, tags = ?, "
                "attrs = ?, present = 1, last_seen = ? WHERE serial = ?",
                (*attrs, txn.now, rec.serial))
        if row["state"] == AVAILABLE:  # seen again: it may have been past the liveness bound
            txn.freed_serials.add(rec.serial)
        if old_attrs[:6] != attrs[:6]:
            log_event(txn, EventKind.UPDATED, serial=rec.serial, detail=rec.describe())
            txn.freed = True  # new attributes may now satisfy a waiter
            report.updated.append(rec.serial)
        if hold_s is not None and info.fence and row["state"] == AVAILABLE:
            hold_fenced_elsewhere(txn, rec.serial, info.fence, hold_s)
        if row["state"] == OFFLINE:
            new = settled_state(txn, rec.serial, present=True)
            set_state(txn, rec.serial, OFFLINE, new, reason="")
            log_event(txn, EventKind.ONLINE, serial=rec.serial, from_state=OFFLINE, to_state=new,
                      detail=f"seen again on {rec.server}")
            report.returned.append(rec.serial)
    for serial, row in existing.items():
        if serial in seen or (scanned is not None and row["server"] not in scanned):
            continue
        if row["present"]:
            txn.run("UPDATE devices SET present = 0 WHERE serial = ?", (serial,))
        if row["state"] in (OFFLINE, QUARANTINED):
            continue  # already out of the pool; quarantine stays the reason shown
        set_state(txn, serial, row["state"], OFFLINE, reason=f"not found on {row['server']}")
        log_event(txn, EventKind.OFFLINE, serial=serial, from_state=row["state"], to_state=OFFLINE,
                  detail=f"not found on {row['server']}" + _forget_failures(txn, row))
        report.vanished.append(serial)
    if config_tags is not None:
        _apply_config_tags(txn, seen, existing, config_tags, report)
    return report


FENCED_ELSEWHERE = "fenced by another pool's lease"


def hold_fenced_elsewhere(txn: Txn, serial: str, fence: str, hold_s: float) -> bool:
    """Hold an available device back for ``hold_s`` if its fence names a lease this pool never
    granted: the device was leased from another pool, one deleted or replaced under its holders
    (a fresh pool at the same path knows nothing of them). They stop once they notice, within a
    heartbeat interval; until then the device is theirs. The hold is a lease of this pool that
    nobody renews: it shows who holds the device and why, and it expires as any lease does. Once
    per fence: a fence nobody claims again (its holders gone) is not held twice. Returns whether
    the device was held."""
    if txn.one("SELECT 1 AS x FROM leases WHERE token = ?", (fence,)) is not None:
        return False  # ours: a lease of this pool (live, or ended and its fence left behind)
    purpose = f"{FENCED_ELSEWHERE} {fence[:8]}"
    if txn.one("SELECT 1 AS x FROM leases WHERE serial = ? AND purpose = ?", (serial, purpose)):
        return False
    if not change_state(txn, serial, AVAILABLE, LEASED):
        return False
    token = secrets.token_hex(16)
    holder = Holder(user="?", host="?", pid=0, purpose=purpose)
    txn.run("INSERT INTO leases (token, serial, holder_user, holder_host, holder_pid, holder_ci_job, "
            "purpose, priority, request, created, renewed, expires) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (token, serial, *holder_params(holder), 0, "{}", txn.now, txn.now, txn.now + hold_s))
    log_event(txn, EventKind.LEASED, serial=serial, from_state=AVAILABLE, to_state=LEASED, token=token,
              holder=holder.describe(),
              detail=f"held back {hold_s:g}s: the device's fence names lease {fence[:8]}, which this "
                     f"pool never granted (a pool deleted or replaced under its holders?)")
    log.warning("device %s: its fence names lease %s, which this pool never granted: held back %gs",
                serial, fence[:8], hold_s)
    return True


def _apply_config_tags(txn: Txn, seen: dict[str, DeviceRecord], existing: dict[str, dict[str, Any]],
                       config_tags: Mapping[str, Iterable[str]], report: SyncReport) -> None:
    for serial in seen:
        wanted = json.dumps(sorted(set(config_tags.get(serial, ()))))
        old = existing[serial]["config_tags"] if serial in existing else "[]"
        if old == wanted:
            continue
        txn.run("UPDATE devices SET config_tags = ? WHERE serial = ?", (wanted, serial))
        listed = ", ".join(json.loads(wanted)) or "none"
        log_event(txn, EventKind.TAGGED, serial=serial, detail=f"config tags: {listed}")
        txn.freed = True  # a waiter for these tags may now be served
        if serial not in report.updated and serial not in report.added:
            report.updated.append(serial)


def mark_stale(txn: Txn, liveness_s: float) -> list[str]:
    """Available devices not seen within ``liveness_s`` go offline: nobody has shown they still
    answer (a sync that found them, or a success on them). A sync that finds them brings them back.
    Leased devices are left to their holder; they are checked when they come back to the pool."""
    cutoff = txn.now - liveness_s
    rows = txn.all("SELECT serial, last_seen FROM devices WHERE state = ? AND last_seen < ?",
                   (AVAILABLE, cutoff))
    for row in rows:
        why = (f"not seen for {txn.now - row['last_seen']:.0f}s (liveness bound {liveness_s:g}s; "
               f"'farm pool sync' or 'farm pool watch' refreshes it)")
        set_state(txn, row["serial"], AVAILABLE, OFFLINE, reason=why)
        log_event(txn, EventKind.OFFLINE, serial=row["serial"], from_state=AVAILABLE, to_state=OFFLINE,
                  detail=why)
    return [r["serial"] for r in rows]


def touch(txn: Txn, serials: Iterable[str]) -> list[str]:
    """Mark devices seen now (their adb server lists them as usable). Returns the serials that a
    touch cannot bring up to date (unknown to the pool, or offline): they need a full sync."""
    need_sync = []
    for serial in dict.fromkeys(serials):
        row = txn.one("SELECT state, present FROM devices WHERE serial = ?", (serial,))
        if row is None or row["state"] == OFFLINE or not row["present"]:
            need_sync.append(serial)
            continue
        txn.run("UPDATE devices SET last_seen = ? WHERE serial = ?", (txn.now, serial))
        if row["state"] == AVAILABLE:  # it may have been past the liveness bound: match it again
            txn.freed_serials.add(serial)
    return need_sync


def prune(txn: Txn, older_than_s: float) -> list[str]:
    """Drop the rows of devices offline (and unseen) for longer than ``older_than_s``, with their
    ended leases and their events from before that; never a device with a live lease, and never a
    quarantined one (its reason must survive until someone restores or removes it)."""
    cutoff = txn.now - older_than_s
    rows = txn.all("SELECT * FROM devices WHERE state = ? AND state_since < ? AND last_seen < ? "
                   "ORDER BY serial", (OFFLINE, cutoff, cutoff))
    pruned = []
    for row in rows:
        serial = row["serial"]
        if has_live_lease(txn, serial):
            continue
        txn.run("DELETE FROM leases WHERE serial = ? AND ended IS NOT NULL", (serial,))
        txn.run("DELETE FROM events WHERE serial = ? AND at < ?", (serial, cutoff))
        txn.run("DELETE FROM devices WHERE serial = ?", (serial,))
        log_event(txn, EventKind.PRUNED, serial=serial, from_state=OFFLINE,
                  detail=f"offline {(txn.now - row['state_since']) / 86400:.1f} days, last seen "
                         f"{(txn.now - row['last_seen']) / 86400:.1f} days ago on {row['server']}"
                         + (f" ({row['reason']})" if row["reason"] else ""))
        pruned.append(serial)
    return pruned


def tag(txn: Txn, serial: str, tags: Iterable[str], *, remove: bool = False) -> None:
    """Add (or remove) ``farm pool tag`` tags of a device. Removing a tag that the config or
    discovery gives is a UsageError naming where it comes from."""
    row = _device_row(txn, serial)
    tags = list(dict.fromkeys(tags))
    if not tags:
        raise UsageError(f"device {serial}: no tag given")
    for t in tags:
        problem = tag_problem(t)
        if problem:
            raise UsageError(f"device {serial}: {problem}")
    admin = set(json.loads(row["admin_tags"]))
    if remove:
        for t in tags:
            if t in admin:
                continue
            if t in json.loads(row["config_tags"]):
                raise UsageError(f"device {serial}: tag {t!r} comes from the farm config "
                                 f"([[devices]] serial = {serial!r}); remove it there")
            if t in json.loads(row["tags"]):
                raise UsageError(f"device {serial}: tag {t!r} is reported by discovery, not set "
                                 f"with 'farm pool tag'")
            raise UsageError(f"device {serial}: has no tag {t!r} (tags: "
                             f"{', '.join(tags_of_row(row)) or 'none'})")
        new = admin - set(tags)
    else:
        new = admin | set(tags)
        txn.freed = True  # a waiter for these tags may now be served
    txn.run("UPDATE devices SET admin_tags = ? WHERE serial = ?", (json.dumps(sorted(new)), serial))
    log_event(txn, EventKind.UNTAGGED if remove else "tagged", serial=serial,
              detail=", ".join(tags))


def _mark_unusable(txn: Txn, rec: DeviceRecord, row: dict[str, Any] | None, why: str,
                   report: SyncReport) -> None:
    """A device adb lists but cannot use (offline, unauthorized): in the pool, but offline. Its
    attributes are not overwritten, they could not be read."""
    if row is None:
        txn.run("INSERT INTO devices (serial, server, virtual, state, reason, present, first_seen, "
                "last_seen, state_since) VALUES (?, ?, ?, 'offline', ?, 0, ?, ?, ?)",
                (rec.serial, rec.server, int(rec.virtual), why, txn.now, txn.now, txn.now))
        log_event(txn, EventKind.ADDED, serial=rec.serial, to_state=OFFLINE, detail=why)
        report.added.append(rec.serial)
        return
    txn.run("UPDATE devices SET present = 0 WHERE serial = ?", (rec.serial,))
    if row["state"] in (OFFLINE, QUARANTINED):
        return
    set_state(txn, rec.serial, row["state"], OFFLINE, reason=why)
    log_event(txn, EventKind.OFFLINE, serial=rec.serial, from_state=row["state"], to_state=OFFLINE,
              detail=why + _forget_failures(txn, row))
    report.vanished.append(rec.serial)


def _forget_failures(txn: Txn, row: dict[str, Any]) -> str:
    """A device going offline: the infra failures counted just before (the plugin records the
    failure, then resyncs) were its vanishing, not a wrong answer; it returns with a clean count."""
    if not int(row["infra_failures"]):
        return ""
    txn.run("UPDATE devices SET infra_failures = 0 WHERE serial = ?", (row["serial"],))
    return f"; {row['infra_failures']} infra failure(s) not held against it"


def quarantine(txn: Txn, serial: str, reason: str) -> None:
    row = _device_row(txn, serial)
    if not reason.strip():
        raise UsageError(f"device {serial}: quarantine needs a reason")
    if row["state"] != QUARANTINED:
        set_state(txn, serial, row["state"], QUARANTINED, reason=reason)
    else:
        txn.run("UPDATE devices SET reason = ? WHERE serial = ?", (reason, serial))
    log_event(txn, EventKind.QUARANTINED, serial=serial, from_state=row["state"], to_state=QUARANTINED,
              detail=reason)


def restore(txn: Txn, serial: str) -> str:
    """Bring a quarantined device back (and reset its failure count); returns the new state."""
    row = _device_row(txn, serial)
    new = row["state"]
    if row["state"] == QUARANTINED:
        new = settled_state(txn, serial, present=bool(row["present"]))
        set_state(txn, serial, QUARANTINED, new, reason="" if new != OFFLINE else "not found")
    txn.run("UPDATE devices SET infra_failures = 0 WHERE serial = ?", (serial,))
    log_event(txn, EventKind.RESTORED, serial=serial, from_state=row["state"], to_state=new)
    return new


def record_infra_failure(txn: Txn, serial: str, reason: str, quarantine_after: int,
                         window_s: float = 0.0) -> bool:
    """Count one infra failure; quarantine at ``quarantine_after`` in a row. True if quarantined now.

    Failures within ``window_s`` of the last counted one are one incident (a killed adb server, a
    retry that went straight back to the same device) and count once; they are logged, not counted.
    A device that is offline (it vanished: unplugged, killed) is not failing, it is absent: its
    failures are not counted either, and it comes back when it returns.
    """
    row = _device_row(txn, serial)
    failures = int(row["infra_failures"])
    if row["state"] == OFFLINE or not row["present"]:
        log_event(txn, EventKind.INFRA_FAILURE, serial=serial,
                  detail=f"not counted (device {row['state'] if row['state'] == OFFLINE else 'absent'}"
                         f"): {reason}")
        return False
    last = row["failure_counted_at"]
    if failures and last is not None and txn.now - last < window_s:
        log_event(txn, EventKind.INFRA_FAILURE, serial=serial,
                  detail=f"not counted ({txn.now - last:.2f}s after the last counted one, within the "
                         f"{window_s:g}s window; {failures} in a row): {reason}")
        return False
    failures += 1
    txn.run("UPDATE devices SET infra_failures = ?, failure_counted_at = ? WHERE serial = ?",
            (failures, txn.now, serial))
    log_event(txn, EventKind.INFRA_FAILURE, serial=serial, detail=f"{failures} in a row: {reason}")
    if failures >= quarantine_after and row["state"] != QUARANTINED:
        quarantine(txn, serial, f"{failures} consecutive infra failures; last: {reason}")
        log.warning("device %s quarantined after %d infra failures in a row; last: %s",
                    serial, failures, reason)
        return True
    return False


def record_recovery(txn: Txn, serial: str, detail: str) -> None:
    _device_row(txn, serial)
    log_event(txn, EventKind.RECOVERY, serial=serial, detail=detail)


def record_success(txn: Txn, serial: str) -> None:
    """The device did its work: it answers, so it counts as seen now (liveness)."""
    row = _device_row(txn, serial)
    txn.run("UPDATE devices SET last_seen = ? WHERE serial = ?", (txn.now, serial))
    if int(row["infra_failures"]):
        txn.run("UPDATE devices SET infra_failures = 0 WHERE serial = ?", (serial,))
        log_event(txn, EventKind.FAILURES_RESET, serial=serial,
                  detail=f"success after {row['infra_failures']} infra failures")
