"""The pool's events as a run reports them: what happened to the devices of its SoCs while it ran."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from farm.db.base import Store
from farm.vocab import EventKind

# The kinds a run's report lists among its infrastructure events.
INFRA_EVENT_KINDS = tuple(k for k in EventKind if k.infra_name is not None)


def infra_events(store: Store, after_id: int, socs: Sequence[str]) -> list[dict[str, Any]]:
    """The pool's events after event ``after_id`` (the last one before the run) that concern devices
    of ``socs``: quarantines, devices going offline or back, leases that ran out before their release,
    infrastructure failures. Oldest first, as ``{at, serial, kind, reason}`` (``at`` ISO 8601 UTC)."""
    if not socs:
        return []
    kinds = list(INFRA_EVENT_KINDS)
    sql = (f"SELECT at, serial, kind, detail FROM events WHERE id > ? "
           f"AND kind IN ({', '.join('?' * len(kinds))}) "
           f"AND serial IN (SELECT serial FROM devices WHERE soc IN ({', '.join('?' * len(socs))})) "
           f"ORDER BY id")
    with store.read() as txn:
        rows = txn.all(sql, [after_id, *kinds, *socs])
    return [{"at": datetime.fromtimestamp(r["at"], timezone.utc).isoformat(timespec="seconds"),
             "serial": r["serial"], "kind": EventKind(r["kind"]).infra_name, "reason": r["detail"]}
            for r in rows]


def last_event_id(store: Store) -> int:
    """The id of the pool's latest event (0 for none): a run's infrastructure events come after it."""
    with store.read() as txn:
        row = txn.one("SELECT MAX(id) AS id FROM events")
    return int(row["id"]) if row and row["id"] is not None else 0
