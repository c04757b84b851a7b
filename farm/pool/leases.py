"""The leasing API: acquire a device by constraints, keep it alive with a heartbeat, release it.

    pool = Pool.open("sqlite:///~/.ptefarm/pool.db")
    with pool.acquire(LeaseRequest(socs=("SM8650",), priority=PRIORITIES["pr"]),
                      ttl_s=300, timeout_s=600) as lease:
        run_on(lease.serial, lease.server)

Waiting is a row in the ``queue`` table, and every lease is granted by one function, ``dispatch``, run
inside the serialized write transaction of every pool change (a new request, a release, an expiry, a
restore, a sync): it gives each available device to the first waiter in service order (priority, then
arrival) whose request the device satisfies. So waiters are served in priority then arrival order among
those who want that kind of device, and a waiter for a rare SoC does not block one for a common SoC.
A waiter polls with one cheap read (granted yet?) and takes the write lock only when something changed
for it; a waiter that stops polling (killed) is dropped after ``waiter_stale_s``, and a device granted
to a holder that died before noticing comes back when that lease's TTL runs out.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import math
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Self

from farm.config import FarmConfig, PoolConfig
from farm.db.base import Listener, PoolLost, Store, StoreOwner, Txn, Where
from farm.db.connect import open_store
from farm.errors import LeaseError, LeaseLost, LeaseTimeout, PoolError, UsageError
from farm.pool import health
from farm.pool.model import (
    AVAILABLE,
    LEASED,
    OFFLINE,
    DeviceRecord,
    DeviceStatus,
    Event,
    Holder,
    LeaseInfo,
    LeaseRequest,
    PoolStatus,
    QueueEntry,
    SyncReport,
    htp_arch_number,
)
from farm.pool.rows import (
    device_from_row,
    end_lease,
    event_from_row,
    holder_params,
    lease_from_row,
    log_event,
    queue_from_row,
    reclaim_expired,
    set_state,
    token_problem,
)
from farm.vocab import EventKind

if TYPE_CHECKING:
    from farm.device.probe import DeviceInfo

log = logging.getLogger(__name__)

DEFAULT_POLL_S = 0.05
# With grants pushed (farm.db.wakeup), a waiter polls only to notice expired leases and lost
# notifications; a killed holder's device is then reclaimed within this much after its TTL.
PUSHED_POLL_S = 1.0
MAX_DESCRIBED_DEVICES = 12
# Infra failures of one device within this many seconds of the last counted one are one incident.
DEFAULT_FAILURE_WINDOW_S = 5.0
# Fencing: a holder trusts its lease until (start of the last successful acquire/renew) + the lease's
# remaining time, minus this margin (at most a tenth of the TTL), on its own clock: see Lease.check.
FENCE_MARGIN_S = 1.0
# CLOCK_BOOTTIME also counts time the host spent suspended, which CLOCK_MONOTONIC does not: a laptop
# that slept past the TTL must not think its lease still good.
_FENCE_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)


# How far a renewer's clock may read before the lease's last renewal (NTP slews, two processes
# reading the clock a moment apart) before it counts as a clock that went back (ClockBehind).
CLOCK_STEP_TOLERANCE_S = 5.0


class ClockBehind(PoolError):
    """This process's pool clock reads earlier than the pool's record of a lease (its clock went
    back): its writes would time the lease wrongly for everyone else. Not an outage to retry."""


def fence_clock() -> float:
    """The local clock a lease's fence deadline is kept on (seconds, only differences matter)."""
    return time.clock_gettime(_FENCE_CLOCK) if _FENCE_CLOCK is not None else time.monotonic()


def fence_margin(ttl_s: float) -> float:
    return min(FENCE_MARGIN_S, ttl_s / 10)


class HolderClock:
    """How a lease holder reads time (its fence deadline) and waits it out (its heartbeat): this
    process's clock, which may step (a VM restored, a faked clock: it has been seen to go back an
    hour). A lease's lifetime is the pool's to decide, on the pool's clock; a holder only trusts its
    own clock while it runs forwards (see Lease.check). Tests pass a clock that steps."""

    def now(self) -> float:
        return fence_clock()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Block until ``event`` is set (True) or ``seconds`` passed on this clock (False)."""
        return event.wait(seconds)


SYSTEM_CLOCK = HolderClock()


@dataclass
class _Outcome:
    """What one acquire attempt decided, carried out of the transaction (errors are raised after
    commit, so that e.g. leaving the queue is not rolled back by the error itself)."""

    lease: LeaseInfo | None = None
    device: DeviceRecord | None = None
    queue_id: int | None = None
    timeout_message: str | None = None
    refused: str | None = None  # the request can never be served by this pool: bad input
    remaining_s: float = 0.0  # the lease's time left, pool clock, when the transaction began


# The queue's service order in SQL: QueueEntry.rank, priority (highest first), then arrival.
SERVICE_ORDER = "ORDER BY priority DESC, id"


def waiting(txn: Txn) -> list[QueueEntry]:
    """The queue in service order: priority (highest first), then arrival."""
    return [queue_from_row(r) for r in txn.all(f"SELECT * FROM queue {SERVICE_ORDER}")]


def dispatch(txn: Txn, liveness_s: float | None = None) -> dict[int, str]:
    """Give each available device to the first waiter, in service order, whose request it satisfies.

    This and ``dispatch_entry`` are the only places a lease is created. A waiter at the head of the
    queue for one kind of device does not hold back a device it cannot use. With ``liveness_s``, only
    devices seen within that many seconds are granted. Returns {queue id: lease token} of the grants.

    Incremental: after every write no available device satisfies any waiter (this function and
    ``dispatch_entry`` keep that true), so only what changed needs matching: the devices that became
    available in this transaction (``txn.freed_serials``), or, when attributes, tags or liveness
    changed (``txn.freed``), every available device. At 1,000 devices, matching all of them on every
    release was the pool lock's whole hold time.
    """
    full, serials = txn.freed, sorted(txn.freed_serials)
    txn.freed, txn.freed_serials = False, set()
    if not full and not serials:
        return {}
    seen_since = -math.inf if liveness_s is None else txn.now - liveness_s
    # Least recently changed first, so that load spreads over equivalent devices.
    sql, params = f"SELECT {DEVICE_COLUMNS} FROM devices WHERE state = ? AND last_seen >= ?", [AVAILABLE, seen_since]
    if not full:
        sql += f" AND serial IN ({', '.join('?' * len(serials))})"
        params += serials
    devices = txn.all(sql + " ORDER BY state_since, serial", params)
    if not devices:
        return {}
    # The queue's requests only: a row is read whole for the waiter a device goes to. Requests are
    # parsed once per process (a queue row's request never changes): this runs under the pool lock.
    # A few devices freed: for each, only the waiters whose SoCs and serial admit it (SQL); many
    # (a sync, a tag): the whole queue once.
    everyone = txn.all(f"SELECT id, request FROM queue {SERVICE_ORDER}") if len(devices) > 8 else None
    granted: dict[int, str] = {}
    for row in devices:
        device = device_from_row(row)
        if everyone is not None:
            _first_waiter(txn, device, everyone, granted)
            continue
        # The first waiters in service order that admit it, then (none of them took it: tags,
        # exclusions) the rest: the usual release parses one request, not the queue.
        # Whole rows: the waiter a device goes to is then granted without reading its row again
        # (on PostgreSQL, a round trip under the pool lock).
        candidates = ("SELECT * FROM queue WHERE (match_socs IS NULL OR match_socs = '' OR "
                      f"match_socs LIKE ?) AND (match_serial IS NULL OR match_serial = ?) {SERVICE_ORDER}")
        params = (f"%,{(device.soc or '?').upper()},%", device.serial)
        head = txn.all(candidates + " LIMIT 32", params)
        if not _first_waiter(txn, device, head, granted) and len(head) == 32:
            _first_waiter(txn, device, txn.all(candidates, params)[32:], granted)
    txn.wake(granted)
    return granted


def _first_waiter(txn: Txn, device: DeviceRecord, rows: list[dict[str, Any]], granted: dict[int, str]) -> bool:
    """Grant ``device`` to the first of ``rows`` (queue rows in service order: whole, or their ids and
    requests) that it satisfies and that has no grant yet; whether one took it."""
    for queue_row in rows:
        queue_id = int(queue_row["id"])
        if queue_id not in granted and _request(queue_id, queue_row["request"]).matches(device):
            entry = queue_from_row(queue_row) if "ttl" in queue_row else _entry(txn, queue_id)
            granted[queue_id] = _grant(txn, device, entry).token
            return True
    return False


def enqueue_entry(txn: Txn, request: LeaseRequest, holder: Holder, ttl: float) -> QueueEntry:
    """A new waiter at the back of its priority: the entry as written (no read back)."""
    queue_id = txn.insert(
        "INSERT INTO queue (priority, request, holder_user, holder_host, holder_pid, holder_ci_job, "
        "purpose, ttl, enqueued, polled, match_socs, match_serial) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (request.priority, request.to_json(), *holder_params(holder), ttl, txn.now, txn.now,
         f",{','.join(request.socs)}," if request.socs else "", request.serial))
    return QueueEntry(id=queue_id, request=request, holder=holder, ttl=ttl, enqueued=txn.now, polled=txn.now)


def dispatch_entry(txn: Txn, queue_id: int, request: LeaseRequest,
                   liveness_s: float | None = None) -> str | None:
    """Serve one waiter from the available devices (one re-checking its place); its lease token, or
    None. Every other waiter is already matched against every available device (``dispatch``), so
    the first available device that satisfies this request is this waiter's."""
    device = first_available(txn, request, liveness_s)
    if device is None:
        return None
    token = _grant(txn, device, _entry(txn, queue_id)).token
    txn.wake({queue_id: token})
    return token


def first_available(txn: Txn, request: LeaseRequest, liveness_s: float | None = None) -> DeviceRecord | None:
    """The available device a new or re-checking waiter gets, if any: the least recently changed
    that satisfies ``request``. The SQL narrows the candidates to the request's SoCs, serial or arch
    floor: the lock is not held while 1,000 rows are read."""
    seen_since = -math.inf if liveness_s is None else txn.now - liveness_s
    sql, params = f"SELECT {DEVICE_COLUMNS} FROM devices WHERE state = ? AND last_seen >= ?", [AVAILABLE, seen_since]
    if request.serial is not None:
        sql += " AND serial = ?"
        params.append(request.serial)
    elif request.socs:
        sql += f" AND soc IN ({', '.join('?' * len(request.socs))})"
        params += list(request.socs)
    elif request.min_htp_arch is not None:
        # An arch floor that only busy devices meet would otherwise convert every available device
        # of the farm (11 ms under the lock at 1,000 devices): only the arch spellings at or above
        # it. The column is as probed ("v75", "75"), so the spellings are read, not assumed.
        archs = [r["htp_arch"] for r in txn.all("SELECT DISTINCT htp_arch FROM devices WHERE htp_arch IS NOT NULL")
                 if (number := _arch_number(r["htp_arch"])) is not None and number >= request.min_htp_arch]
        if not archs:
            return None
        sql += f" AND htp_arch IN ({', '.join('?' * len(archs))})"
        params += archs
    if request.virtual is not None:
        sql += " AND virtual = ?"
        params.append(int(request.virtual))
    # Read as matched: a request most devices satisfy ("anything", an HTP arch floor) stops at its
    # first candidate instead of converting every available device of the farm.
    with contextlib.closing(txn.rows(sql + " ORDER BY state_since, serial", params)) as candidates:
        for row in candidates:
            device = device_from_row(row)
            if request.matches(device):
                return device
    return None


# What device_from_row reads: not ``attrs`` (everything a probe saw, as JSON), the widest column.
DEVICE_COLUMNS = ("serial, server, soc, htp_arch, model, virtual, tags, config_tags, admin_tags, state, "
                  "reason, present, infra_failures, last_seen")

_PARSED: dict[tuple[int, str], LeaseRequest] = {}


def _arch_number(value: str) -> int | None:
    """A stored arch's number; None for a spelling no request could be compared with (matches()
    then refuses it too)."""
    try:
        return htp_arch_number(value)
    except UsageError:
        return None


def _request(queue_id: int, text: str) -> LeaseRequest:
    key = (queue_id, text)  # an id may be reused after its row is gone: the text keys it too
    request = _PARSED.get(key)
    if request is None:
        if len(_PARSED) > 10_000:
            _PARSED.clear()
        request = _PARSED[key] = LeaseRequest.from_json(text)
    return request


def _entry(txn: Txn, queue_id: int) -> QueueEntry:
    row = txn.one("SELECT * FROM queue WHERE id = ?", (queue_id,))
    assert row is not None
    return queue_from_row(row)


def _grant(txn: Txn, device: DeviceRecord, entry: QueueEntry) -> LeaseInfo:
    """Lease ``device`` to ``entry``'s holder and take the entry off the queue: the lease as written."""
    token = secrets.token_hex(16)
    txn.run("INSERT INTO leases (token, serial, holder_user, holder_host, holder_pid, holder_ci_job, "
            "purpose, priority, request, created, renewed, expires, queue_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (token, device.serial, *holder_params(entry.holder), entry.request.priority,
             entry.request.to_json(), txn.now, txn.now, txn.now + entry.ttl, entry.id))
    set_state(txn, device.serial, AVAILABLE, LEASED)
    txn.run("DELETE FROM queue WHERE id = ?", (entry.id,))
    log_event(txn, EventKind.LEASED, serial=device.serial, from_state=AVAILABLE, to_state=LEASED, token=token,
              queue_id=entry.id, holder=entry.holder.describe(), detail=entry.request.to_json())
    return LeaseInfo(token=token, serial=device.serial, holder=entry.holder, priority=entry.request.priority,
                     created=txn.now, renewed=txn.now, expires=txn.now + entry.ttl, ended=None, end_reason=None)


class Pool(StoreOwner):
    """A handle on the shared pool. Thread-safe; open one per process."""

    def __init__(self, store: Store, settings: PoolConfig | None = None, *,
                 poll_s: float = DEFAULT_POLL_S, waiter_stale_s: float = 30.0,
                 failure_window_s: float = DEFAULT_FAILURE_WINDOW_S,
                 device_tags: Mapping[str, Sequence[str]] | None = None,
                 clock: HolderClock = SYSTEM_CLOCK):
        """``settings``: the config's [pool] (farm.config.PoolConfig; None: its defaults), of which
        the pool uses the default TTL and acquire timeout, ``quarantine_after`` and ``liveness_s``: a
        device is leased only if it was seen (found by a sync, or a success recorded on it) within
        that many seconds; an available one not seen for longer goes offline until a sync finds it
        again (None: no bound). ``device_tags``: serial -> tags from the farm config, applied by
        ``sync`` (None: a sync leaves the pool's config tags alone). The keywords are the pool's own
        tuning, which no config sets."""
        self.settings = settings if settings is not None else PoolConfig(url=store.url)
        liveness_s = self.settings.liveness_s
        if liveness_s is not None and not 0 < liveness_s < float("inf"):
            raise ValueError(f"liveness_s must be finite and > 0, got {liveness_s}")
        self.device_tags = None if device_tags is None else \
            {serial: tuple(tags) for serial, tags in device_tags.items()}
        self.store = store
        if not 0 <= failure_window_s < float("inf"):
            raise ValueError(f"failure_window_s must be finite and >= 0, got {failure_window_s}")
        self.failure_window_s = failure_window_s
        self.poll_s = poll_s
        self.waiter_stale_s = waiter_stale_s
        self.clock = clock  # this process's, for its leases' fences and heartbeats
        self._stale_checked = 0.0

    # The settings as the pool's code reads them: one source (``settings``), never a copy.
    @property
    def liveness_s(self) -> float | None:
        return self.settings.liveness_s

    @property
    def quarantine_after(self) -> int:
        return self.settings.quarantine_after

    @property
    def default_ttl_s(self) -> float:
        return self.settings.lease_ttl_s

    @property
    def default_timeout_s(self) -> float:
        return self.settings.acquire_timeout_s

    @classmethod
    def open(cls, url: str, settings: PoolConfig | None = None, *, connect_timeout_s: float = 10.0,
             lock_timeout_s: float = 30.0, **options: Any) -> Pool:
        """Connect to the pool at ``url`` and create or migrate its schema; it leases as ``settings``
        (the config's [pool], e.g. ``config.pool``; None: the defaults) says. The URL is ``url``, not
        ``settings.url``: a virtual run opens a pool of its own with the configured settings."""
        return cls(open_store(url, connect_timeout_s=connect_timeout_s,
                              lock_timeout_s=lock_timeout_s), settings, **options)

    @classmethod
    def from_config(cls, config: FarmConfig, **options: Any) -> Pool:
        """The configured pool: its URL and settings, with the config's device tags."""
        options.setdefault("device_tags", config.device_tags)
        return cls.open(config.pool.url, config.pool, **options)

    # -- leasing -------------------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[Txn]:
        """A write transaction that first settles the pool (expired leases, stale waiters, free devices
        to waiters) and hands out whatever the body freed before it commits."""
        with self.store.write() as txn:
            # One statement asks whether anything needs settling (usually nothing does), with the
            # clock in SQL so that it shares the clock's round trip: every round trip here is spent
            # holding the pool lock. (Its clock is read a moment after txn.now: what it finds due,
            # the settling below, at txn.now, may find not yet due, and leave for the next write.)
            due = txn.one("SELECT EXISTS (SELECT 1 FROM leases WHERE ended IS NULL AND expires < {now}) "
                          "AS expired, EXISTS (SELECT 1 FROM devices WHERE state = ? "
                          "AND last_seen < {now} - ?) AS stale",
                          (AVAILABLE, self.liveness_s or 0.0))
            assert due is not None
            if due["expired"]:
                reclaim_expired(txn)
            if self.liveness_s is not None and due["stale"]:
                health.mark_stale(txn, self.liveness_s)
            if time.monotonic() - self._stale_checked > self.waiter_stale_s / 10:
                self._drop_stale_waiters(txn)
                self._stale_checked = time.monotonic()
            if txn.freed or txn.freed_serials:
                self._dispatch(txn)
            yield txn
            if txn.freed or txn.freed_serials:
                self._dispatch(txn)

    def _dispatch(self, txn: Txn) -> dict[int, str]:
        return dispatch(txn, self.liveness_s)

    def acquire(self, request: LeaseRequest | None = None, holder: Holder | None = None,
                ttl_s: float | None = None, timeout_s: float | None = None,
                heartbeat_s: float | None = None,
                on_wait: Callable[[float], None] | None = None) -> Lease:
        """Wait up to ``timeout_s`` for a device matching ``request`` and lease it for ``ttl_s``.

        Raises LeaseTimeout (an InfraError) naming what was asked, what exists and who holds it.
        The returned Lease renews itself from a heartbeat thread while used as a context manager.
        ``on_wait(seconds waited)`` is called each time the request goes back to waiting (every poll
        interval at most), so that a caller can show who it waits for (``status()``); the pool itself
        prints nothing. An exception it raises ends the wait, leaving the queue.
        """
        request = request or LeaseRequest()
        holder = holder or Holder.current()
        ttl = self.default_ttl_s if ttl_s is None else float(ttl_s)
        timeout = self.default_timeout_s if timeout_s is None else float(timeout_s)
        if ttl <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        began = time.monotonic()
        deadline = began + max(0.0, timeout)
        queue_id: int | None = None
        last_write = 0.0
        listener: Listener | None = None
        announced = False  # the listener heard of our grant: read it without polling first
        try:
            while True:
                give_up = time.monotonic() >= deadline
                if (queue_id is not None and not give_up
                        and time.monotonic() - last_write < self.waiter_stale_s / 4):
                    poll = "granted" if announced else self._poll(queue_id)
                    announced = False
                    if poll == "granted":
                        # Dispatch committed our lease already: reading it needs no write lock.
                        started = self.clock.now()
                        with self.store.read() as txn:  # one round trip for both, and the clock
                            leases, devices = txn.all_of(
                                ("SELECT * FROM leases WHERE queue_id = ?", (queue_id,)),
                                ("SELECT * FROM devices WHERE serial = "
                                 "(SELECT serial FROM leases WHERE queue_id = ?)", (queue_id,)))
                            if leases and devices and leases[0]["ended"] is None:
                                outcome = self._outcome_granted(txn, leases[0], devices[0])
                                queue_id = None
                                return self._lease(outcome, ttl, heartbeat_s, started)
                    elif poll == "waiting":
                        # Nothing for us yet: wait without taking the pool's write lock.
                        if on_wait is not None:
                            on_wait(time.monotonic() - began)
                        assert listener is not None
                        announced = self._wait(listener, queue_id, deadline)
                        continue
                started = self.clock.now()
                with self._write() as txn:
                    outcome = self._attempt(txn, request, holder, ttl, queue_id, give_up, timeout)
                last_write = time.monotonic()
                queue_id = outcome.queue_id
                if outcome.lease is not None:
                    return self._lease(outcome, ttl, heartbeat_s, started)
                if outcome.timeout_message is not None:
                    queue_id = None
                    raise LeaseTimeout(outcome.timeout_message, serial=request.serial)
                if outcome.refused is not None:
                    raise UsageError(outcome.refused)
                if listener is None or listener.queue_id != queue_id:
                    # Listen before the next poll, so that no grant falls between the two; anew
                    # when we had to queue again (dropped as stale): wake-ups go to a queue entry.
                    if listener is not None:
                        listener.close()
                    listener = self.store.listener(queue_id)
                # Poll again at once: the write above may have come back empty-handed just as
                # another process's dispatch granted us a device.
        except BaseException:
            if queue_id is not None:
                self._leave_queue(queue_id, holder)
            raise
        finally:
            if listener is not None:
                listener.close()

    def _lease(self, outcome: _Outcome, ttl: float, heartbeat_s: float | None,
               started: float) -> Lease:
        """The Lease of a grant. Its fence deadline is counted from ``started`` (taken before the
        transaction that read the grant, so never later than the pool's "now" of it): the pool
        cannot have ended the lease before then."""
        assert outcome.lease is not None and outcome.device is not None
        return Lease(self, outcome.lease, outcome.device, ttl,
                     valid_until=started + outcome.remaining_s - fence_margin(ttl),
                     heartbeat_s=heartbeat_s)

    def _wait(self, listener: Listener, queue_id: int, deadline: float) -> bool:
        """Until our grant is announced (True), or the next poll is due (jittered, so that waiters
        do not poll in lock-step), or the deadline. (A waiter always listens: it queued, and listened
        before its first poll.)"""
        interval = max(self.poll_s, PUSHED_POLL_S) if listener.pushes else self.poll_s
        until = min(deadline, time.monotonic() + interval * random.uniform(0.5, 1.5))
        while (left := until - time.monotonic()) > 0:
            if queue_id in listener.wait(left):
                return True
        return False

    def _poll(self, queue_id: int) -> str:
        """One cheap read: "granted" (dispatch gave us a lease), "waiting" (nothing a write could
        change for us), or "write" (we were dropped from the queue, or an expired lease awaits
        reclaiming)."""
        row = self.store.query_one(
            "SELECT (SELECT count(*) FROM leases WHERE queue_id = ?) AS granted, "
            "(SELECT count(*) FROM queue WHERE id = ?) AS queued, "
            "(SELECT count(*) FROM leases WHERE ended IS NULL AND expires < {now}) AS expired",
            (queue_id, queue_id))
        if row["granted"]:
            return "granted"
        return "write" if not row["queued"] or row["expired"] else "waiting"

    def _attempt(self, txn: Txn, request: LeaseRequest, holder: Holder, ttl: float,
                 queue_id: int | None, give_up: bool, timeout: float) -> _Outcome:
        """One write-locked step of acquire. Devices are only ever granted by ``dispatch``; here we
        join the queue, or collect what dispatch granted us, or leave when time is up."""
        if queue_id is not None:
            granted = txn.one("SELECT * FROM leases WHERE queue_id = ?", (queue_id,))
            if granted is None and txn.one("SELECT id FROM queue WHERE id = ?", (queue_id,)) is not None:
                # Normally nothing: every change that frees a device dispatches it. A cheap re-check
                # of this waiter alone, so that a grant never depends on that alone.
                if dispatch_entry(txn, queue_id, request, self.liveness_s) is not None:
                    granted = txn.one("SELECT * FROM leases WHERE queue_id = ?", (queue_id,))
            if granted is not None and granted["ended"] is None:
                return self._outcome_granted(txn, granted)
            if granted is not None or txn.one("SELECT id FROM queue WHERE id = ?", (queue_id,)) is None:
                queue_id = None  # dropped as stale (we were paused too long): queue again, at the back
        if queue_id is None:
            # A device for it now? Then it cannot be refused, and it never waits: no "queued"
            # event, and no wake-up (nobody listens for it yet). What the grant wrote is returned
            # as written: on PostgreSQL each read back would be a round trip under the pool lock.
            device = first_available(txn, request, self.liveness_s)
            if device is None and (refusal := self._refusal(txn, request)) is not None:
                return _Outcome(refused=refusal)
            entry = enqueue_entry(txn, request, holder, ttl)
            queue_id = entry.id
            if device is not None:
                return _Outcome(lease=_grant(txn, device, entry), device=replace(device, state=LEASED),
                                remaining_s=ttl)
            log_event(txn, EventKind.QUEUED, queue_id=queue_id, holder=holder.describe(),
                      detail=request.to_json())
        if give_up:
            ahead = [w for w in waiting(txn) if w.ranks_before(request.priority, queue_id)]
            txn.run("DELETE FROM queue WHERE id = ?", (queue_id,))
            log_event(txn, EventKind.GAVE_UP, queue_id=queue_id, holder=holder.describe(),
                      detail=f"waited {timeout:g}s for {request.describe()}")
            return _Outcome(timeout_message=self._timeout_message(txn, request, timeout, ahead))
        txn.run("UPDATE queue SET polled = ? WHERE id = ?", (txn.now, queue_id))
        return _Outcome(queue_id=queue_id)

    @staticmethod
    def _outcome_granted(txn: Txn, lease_row: dict[str, Any],
                         device_row: dict[str, Any] | None = None) -> _Outcome:
        if device_row is None:
            device_row = txn.one("SELECT * FROM devices WHERE serial = ?", (lease_row["serial"],))
        return _Outcome(lease=lease_from_row(lease_row), device=device_from_row(device_row),
                        remaining_s=lease_row["expires"] - txn.now)

    def _drop_stale_waiters(self, txn: Txn) -> None:
        stale = txn.all("SELECT * FROM queue WHERE polled < ?", (txn.now - self.waiter_stale_s,))
        for row in stale:
            txn.run("DELETE FROM queue WHERE id = ?", (row["id"],))
            log_event(txn, EventKind.ABANDONED, queue_id=row["id"],
                      holder=queue_from_row(row).holder.describe(),
                      detail=f"no poll for {txn.now - row['polled']:.1f}s")

    def _leave_queue(self, queue_id: int, holder: Holder) -> None:
        """Best effort on the way out of an interrupted acquire: leave the queue, and give back a
        device granted meanwhile. A stale row or lease would be cleaned up later anyway."""
        try:
            with self._write() as txn:
                if txn.one("SELECT id FROM queue WHERE id = ?", (queue_id,)) is not None:
                    txn.run("DELETE FROM queue WHERE id = ?", (queue_id,))
                    log_event(txn, EventKind.GAVE_UP, queue_id=queue_id, holder=holder.describe(),
                              detail="acquire interrupted")
                granted = txn.one("SELECT * FROM leases WHERE queue_id = ? AND ended IS NULL",
                                  (queue_id,))
                if granted is not None:
                    end_lease(txn, granted, EventKind.RELEASED)
        except PoolError as e:
            log.warning("leaving queue entry %d after an interrupted acquire failed (%s); "
                        "it is dropped as stale later", queue_id, e)

    def _refusal(self, txn: Txn, request: LeaseRequest) -> str | None:
        """Why no device of this pool could ever serve ``request`` (None: one could, or the pool is
        empty and devices may still be added). Offline and quarantined devices count: they may come
        back; the serials a request excludes count too. A device whose SoC could not be read might be
        any SoC. A SoC name that neither the SoC table nor the pool knows is refused with the
        nearest known names."""
        # The usual answer first, cheaply: the candidates the SQL narrows to (the request's serial,
        # or its SoCs and devices of unknown SoC), parsed until one could serve it. Every new waiter
        # asks this under the pool lock; parsing 1,000 device rows each time was 68 ms of it.
        from farm.soc import HTP_ARCH_BY_SOC

        sql, params = f"SELECT {DEVICE_COLUMNS} FROM devices", []
        # (the pool's own SoC names are read only for a name the SoC table does not know)
        asked, table = set(request.socs), set(HTP_ARCH_BY_SOC)
        if asked and not asked <= table and not asked <= table | {
                str(r["soc"]).upper() for r in txn.all("SELECT DISTINCT soc FROM devices WHERE soc IS NOT NULL")}:
            sql += " WHERE 1 = 0"  # a SoC name nobody knows: the full answer below names it
        elif request.serial is not None:
            sql, params = sql + " WHERE serial = ?", [request.serial]
        elif request.socs:
            sql += f" WHERE soc IN ({', '.join('?' * len(request.socs))}) OR soc IS NULL"
            params = list(request.socs)
        # (a bounded look: past it, the full answer below decides, as it always may)
        if any(_could_match(request, device_from_row(r)) for r in txn.all(sql + " LIMIT 64", params)):
            return None
        devices = [device_from_row(r) for r in txn.all("SELECT * FROM devices ORDER BY serial")]
        if not devices:
            return None
        from farm.soc import HTP_ARCH_BY_SOC

        known = sorted(set(HTP_ARCH_BY_SOC) | {d.soc.upper() for d in devices if d.soc})
        unknown = [s for s in request.socs if s not in known]
        if not unknown and any(_could_match(request, d) for d in devices):
            return None
        reasons = []
        for soc in unknown:
            close = difflib.get_close_matches(soc, known, n=3, cutoff=0.6)
            reasons.append(f"unknown SoC {soc!r}" + (f" (did you mean {' or '.join(close)}?)"
                                                        if close else ""))
        pool_socs = {(d.soc or "").upper() for d in devices}
        if request.socs and not unknown and not (set(request.socs) & pool_socs):
            reasons.append(f"no device of SoC {'|'.join(request.socs)}")
        all_tags = {t for d in devices for t in d.tags}
        missing = [t for t in request.tags if t not in all_tags]
        if missing:
            reasons.append(f"unknown tag(s) {', '.join(missing)}")
        archs = [a for a in (d.htp_arch_num for d in devices) if a is not None]
        if request.min_htp_arch is not None and archs and request.min_htp_arch > max(archs):
            reasons.append(f"HTP >= v{request.min_htp_arch} is above every device (highest: "
                           f"v{max(archs)})")
        if request.serial is not None and request.serial not in {d.serial for d in devices}:
            reasons.append(f"no device {request.serial}")
        if request.virtual is not None and all(d.virtual != request.virtual for d in devices):
            reasons.append(f"no {'virtual' if request.virtual else 'physical'} device")
        if not reasons:
            reasons.append("no single device has all of it")
        return (f"no device in the pool could ever serve [{request.describe()}]: "
                f"{'; '.join(reasons)}. The pool has {_inventory(devices)}")

    def _timeout_message(self, txn: Txn, request: LeaseRequest, timeout: float,
                         ahead: list[QueueEntry]) -> str:
        rows = txn.all("SELECT * FROM devices ORDER BY serial")
        devices = [device_from_row(r) for r in rows]
        matching = [d for d in devices if request.matches(d)]
        head = f"no device for request [{request.describe()}] within {timeout:g}s"
        if not matching:
            listed = "; ".join(d.describe() for d in devices[:MAX_DESCRIBED_DEVICES]) or "none"
            more = f" and {len(devices) - MAX_DESCRIBED_DEVICES} more" \
                if len(devices) > MAX_DESCRIBED_DEVICES else ""
            return f"{head}: no device in the pool matches; the pool has {len(devices)}: {listed}{more}"
        leases = {r["serial"]: lease_from_row(r)
                  for r in txn.all("SELECT * FROM leases WHERE ended IS NULL")}
        parts = []
        for d in matching[:MAX_DESCRIBED_DEVICES]:
            lease = leases.get(d.serial)
            text = f"{d.serial} {d.state}"
            if d.reason:  # an unseen device's says so: _write marked it offline before this
                text += f" ({d.reason})"
            if lease:
                text += (f", held by {lease.holder.describe()} for "
                         f"{txn.now - lease.created:.0f}s, expires in {lease.expires - txn.now:.0f}s")
            parts.append(text)
        queued = f"; {len(ahead)} waiter(s) ahead of this request" if ahead else ""
        return f"{head}: {len(matching)} of {len(devices)} devices match: {'; '.join(parts)}{queued}"

    def renew(self, token: str, ttl_s: float) -> LeaseInfo:
        """Push the lease's expiry to now + ``ttl_s``. LeaseError if it ended or expired;
        ClockBehind if this process's pool clock reads earlier than the lease's last renewal (a
        SQLite pool's clock is each process's own: one that went back would write an expiry that
        has passed for every other process, which would give the device away under its holder)."""
        with self._write() as txn:
            row = txn.one("SELECT * FROM leases WHERE token = ?", (token,))
            if row is not None and row["ended"] is None:
                behind = row["renewed"] - txn.now
                if behind > CLOCK_STEP_TOLERANCE_S:
                    raise ClockBehind(
                        f"cannot renew lease {token[:8]} on {row['serial']}: this process's clock "
                        f"reads {behind:.0f}s before the lease's last renewal (it went back): an "
                        f"expiry written on it would have passed for every other holder")
                txn.run("UPDATE leases SET renewed = ?, expires = ? WHERE token = ?",
                        (txn.now, txn.now + ttl_s, token))
                row.update(renewed=txn.now, expires=txn.now + ttl_s)
                return lease_from_row(row)
            problem = token_problem(txn, token, row)
        raise LeaseError(f"cannot renew: {problem}")

    def release(self, token: str) -> LeaseInfo:
        """End the lease; the device goes back to the pool. LeaseError for a stale or foreign token."""
        with self._write() as txn:
            row = txn.one("SELECT * FROM leases WHERE token = ?", (token,))
            if row is not None and row["ended"] is None:
                end_lease(txn, row, EventKind.RELEASED)
                row.update(ended=txn.now, end_reason=EventKind.RELEASED)
                return lease_from_row(row)
            problem = token_problem(txn, token, row)
        raise LeaseError(f"cannot release: {problem}")

    def release_holder(self, host: str, pid: int, why: str) -> list[str]:
        """End every live lease of process ``pid`` on ``host`` and drop its queued requests: the
        process died (a crashed xdist worker, whose controller saw it go), so nothing will renew or
        release them, and waiting out their TTL would leave the devices idle. Only for a process
        known dead: its fence on the device then names a lease that has ended. Returns the serials."""
        with self._write() as txn:
            leases = txn.all("SELECT * FROM leases WHERE ended IS NULL AND holder_host = ? "
                             "AND holder_pid = ?", (host, int(pid)))
            for row in leases:
                end_lease(txn, row, EventKind.RELEASED)
            for row in txn.all("SELECT * FROM queue WHERE holder_host = ? AND holder_pid = ?",
                               (host, int(pid))):
                txn.run("DELETE FROM queue WHERE id = ?", (row["id"],))
                log_event(txn, EventKind.ABANDONED, queue_id=row["id"],
                          holder=queue_from_row(row).holder.describe(), detail=f"holder died: {why}")
            return [row["serial"] for row in leases]

    # -- health --------------------------------------------------------------------------------

    def sync(self, devices: list[DeviceInfo], servers: list[Any] | None = None) -> SyncReport:
        """Merge a discovery result into the pool. Devices of the scanned ``servers`` (adb server
        addresses or "host:port"; all servers if None) that are missing go offline; returning ones
        come back."""
        with self._write() as txn:
            return health.sync(txn, devices, None if servers is None else [str(s) for s in servers],
                               self.device_tags, hold_s=self.default_ttl_s)

    def touch(self, serials: Sequence[str]) -> list[str]:
        """Mark devices seen now (an adb server lists them as usable: a cheap liveness signal that
        runs no command on them). Returns the serials that need a full ``sync`` instead (unknown to
        the pool, or offline)."""
        with self._write() as txn:
            return health.touch(txn, serials)

    def prune(self, older_than_s: float) -> list[str]:
        """Drop devices offline for longer than ``older_than_s`` (with their ended leases and older
        events); never one with a live lease, never a quarantined one. Returns the serials."""
        if not 0 <= older_than_s < float("inf"):
            raise UsageError(f"prune: the age must be a finite number >= 0, got {older_than_s!r}")
        with self._write() as txn:
            return health.prune(txn, older_than_s)

    def tag(self, serial: str, tags: Sequence[str], *, remove: bool = False) -> DeviceRecord:
        """Add (or with ``remove``, take away) tags set by hand; returns the device with all its tags
        (discovery's, the config's and these)."""
        with self._write() as txn:
            health.tag(txn, serial, tags, remove=remove)
            return device_from_row(txn.one("SELECT * FROM devices WHERE serial = ?", (serial,)))

    def record_infra_failure(self, serial: str, reason: str) -> bool:
        """Count an infra failure; True if this one quarantined the device. Failures within
        ``failure_window_s`` of the last counted one count once; an offline device's are not counted."""
        with self._write() as txn:
            return health.record_infra_failure(txn, serial, reason, self.quarantine_after,
                                               self.failure_window_s)

    def record_success(self, serial: str) -> None:
        with self._write() as txn:
            health.record_success(txn, serial)

    def record_recovery(self, serial: str, detail: str) -> None:
        """Log a rung of the recovery ladder (or its verdict) in the device's history."""
        with self._write() as txn:
            health.record_recovery(txn, serial, detail)

    def quarantine(self, serial: str, reason: str) -> None:
        with self._write() as txn:
            health.quarantine(txn, serial, reason)

    def restore(self, serial: str) -> str:
        with self._write() as txn:
            return health.restore(txn, serial)

    # -- reading -------------------------------------------------------------------------------

    def status(self) -> PoolStatus:
        with self.store.read() as txn:
            leases = {r["serial"]: lease_from_row(r)
                      for r in txn.all("SELECT * FROM leases WHERE ended IS NULL")}
            devices = [DeviceStatus(device_from_row(r), leases.get(r["serial"]))
                       for r in txn.all("SELECT * FROM devices ORDER BY serial")]
            queue = waiting(txn)
            return PoolStatus(now=txn.now, devices=devices, queue=queue)

    def history(self, serial: str | None = None, token: str | None = None, limit: int | None = 100,
                after_id: int = 0) -> list[Event]:
        """Events, oldest first: the last ``limit`` (None: all) after ``after_id``, optionally of one
        device or one lease."""
        where = Where().add("id > ?", after_id).equal(serial=serial, token=token)
        sql = f"SELECT * FROM events{where.sql()} ORDER BY id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self.store.read() as txn:
            rows = txn.all(sql, where.params)
        return [event_from_row(r) for r in reversed(rows)]


def _could_match(request: LeaseRequest, device: DeviceRecord) -> bool:
    """Whether ``device`` could serve ``request`` some day, whatever its state and the request's
    exclusions; a device whose SoC is unknown (adb could not probe it) might be any SoC."""
    loose = replace(request, exclude=())
    if device.soc is None:
        loose = replace(loose, socs=(), min_htp_arch=None)
    return loose.matches(device)


def _inventory(devices: list[DeviceRecord]) -> str:
    """What a pool has, in one line: ``3 device(s): SoC SM8550 (1), SM8650 (2); HTP v73, v75; ...``."""
    socs: dict[str, int] = {}
    tags: dict[str, int] = {}
    for d in devices:
        socs[d.soc or "unknown"] = socs.get(d.soc or "unknown", 0) + 1
        for t in d.tags:
            tags[t] = tags.get(t, 0) + 1
    archs = sorted({d.htp_arch_num for d in devices if d.htp_arch_num is not None})
    parts = ["SoC " + ", ".join(f"{s} ({n})" for s, n in sorted(socs.items()))]
    if archs:
        parts.append("HTP " + ", ".join(f"v{a}" for a in archs))
    parts.append("tags " + (", ".join(f"{t} ({n})" for t, n in sorted(tags.items())) or "none"))
    n_virtual = sum(d.virtual for d in devices)
    parts.append(f"{n_virtual} virtual, {len(devices) - n_virtual} physical")
    offline = [d.serial for d in devices if d.state == OFFLINE]
    if offline:
        parts.append(f"{len(offline)} offline")
    return f"{len(devices)} device(s): {'; '.join(parts)}"


@dataclass
class Lease:
    """A held device. As a context manager it renews itself every ``heartbeat_s`` (a third of the TTL
    by default) from a daemon thread, and releases on exit. If renewal finds the lease gone (it expired
    while the holder was stalled), ``lost`` says why and exit raises LeaseError.

    Fencing: call ``check()`` before every action on the device. It costs no database call: the lease
    keeps a local deadline (when the last successful acquire or renew began, plus the TTL, minus a
    small margin) and ``check()`` raises ``LeaseLost`` once ``lost`` is set or that deadline has
    passed. A holder stopped (SIGSTOP, a suspended VM) past its TTL thus stops at its first action
    after it resumes, before the heartbeat thread has even run. Once fenced, the lease stays lost.

    The deadline is on the holder's clock (``pool.clock``), trusted only while it runs forwards: a
    reading earlier than the one before (the clock stepped back) makes ``check()`` ask the pool, whose
    clock decides the lease's life, at once: a lease that ended meanwhile is LeaseLost whatever the
    holder's clock says, a live one is renewed, its deadline re-based on the stepped clock and the
    heartbeat (whose wait the step may have stretched) woken.
    """

    pool: Pool
    info: LeaseInfo
    device: DeviceRecord
    ttl_s: float
    # The fence deadline on clock.now(): from before the read that granted or found the lease, so
    # never later than the pool's expiry (the one who read the lease knows when that was).
    valid_until: float
    heartbeat_s: float | None = None
    lost: LeaseError | None = None
    clock: HolderClock | None = None  # None: the pool's (this process's clock)
    _wake: threading.Event = field(default_factory=threading.Event, repr=False)  # stop, or renew now
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _read_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _last_read: float = field(default=-math.inf, repr=False)

    def __post_init__(self) -> None:
        if self.clock is None:
            self.clock = self.pool.clock
        # The first reading: a step back from here on is noticed (valid_until is on this scale).
        self._last_read = self.clock.now()

    @property
    def token(self) -> str:
        return self.info.token

    @property
    def serial(self) -> str:
        return self.info.serial

    @property
    def server(self) -> str:
        """The device's adb server, "host:port"."""
        return self.device.server

    def _now(self) -> tuple[float, bool]:
        """The holder's clock, and whether it went back since its last reading."""
        assert self.clock is not None
        with self._read_lock:
            now = self.clock.now()
            stepped_back = now < self._last_read
            self._last_read = now
        return now, stepped_back

    def remaining_s(self) -> float:
        """Seconds until the fence deadline (negative: past it); no database call."""
        return self.valid_until - self._now()[0]

    def check(self) -> None:
        """Raise ``LeaseLost`` (an InfraError carrying the serial) unless the lease is still ours as far
        as this process can tell without asking the pool: not lost, and renewed recently enough that
        the pool cannot have expired it. Cheap (a clock read): call it before every device action.
        Only a clock that stepped back costs a question to the pool (see the class)."""
        if self.lost is None:
            now, stepped_back = self._now()
            if stepped_back:
                self._resync()
                now = self._now()[0]
            left = self.valid_until - now
            if self.lost is None and left > 0:
                return
            if self.lost is None:
                self.lost = LeaseError(
                    f"lease {self.token[:8]} on {self.serial} not renewed for over its TTL of "
                    f"{self.ttl_s:g}s (fence deadline passed {max(0.0, -left):.1f}s ago: the holder "
                    f"stalled, or the pool could not be reached); the pool may have given the device "
                    f"to another holder")
        raise LeaseLost(f"lease on {self.serial} lost: {self.lost}", serial=self.serial)

    def _resync(self) -> None:
        """The holder's clock went back: its deadline means nothing now. Ask the pool (renew): a
        lease that ended is lost; a live one gets a deadline on the clock as it now reads. If the pool
        cannot answer, the deadline is now: nothing proves the lease lives."""
        try:
            self.renew(rebase=True)
        except LeaseError as e:
            self.lost = e
        except PoolLost as e:
            self.lost = LeaseError(str(e))
            self.lost.__cause__ = e
        except ClockBehind as e:
            self.lost = LeaseError(str(e))
        except PoolError as e:
            self.lost = LeaseError(f"the holder's clock went back and the pool could not confirm the "
                                   f"lease: {e}")
        self._wake.set()  # the heartbeat re-bases its wait on the clock as it now reads

    def renew(self, *, rebase: bool = False) -> None:
        """Renew in the pool and push the fence deadline on. ``rebase``: set it from this renewal
        alone (the clock stepped, earlier deadlines are on another scale), not the latest of both."""
        started, stepped_back = self._now()
        info = self.pool.renew(self.token, self.ttl_s)
        self.info = info
        deadline = started + (info.expires - info.renewed) - fence_margin(self.ttl_s)
        self.valid_until = deadline if rebase or stepped_back else max(self.valid_until, deadline)

    def release(self) -> None:
        """End the lease in the pool. LeaseError if it had already ended (expired, taken away)."""
        self.stop_heartbeat()
        self.pool.release(self.token)

    def start_heartbeat(self) -> None:
        if self._thread is None:
            interval = self.heartbeat_s or self.ttl_s / 3
            self._thread = threading.Thread(target=self._beat, args=(interval,),
                                            name=f"lease-heartbeat-{self.serial}", daemon=True)
            self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _beat(self, interval: float) -> None:
        assert self.clock is not None
        while True:
            self.clock.wait(self._wake, interval)
            if self._stop.is_set():
                return
            self._wake.clear()  # a wake-up before this is served by the renewal below
            try:
                self.renew()
            except LeaseError as e:
                self.lost = e
                return
            except PoolLost as e:  # not an outage: the pool that granted the lease is gone
                self.lost = LeaseError(str(e))
                self.lost.__cause__ = e  # farm.results.outcome.pool_lost reads it: the run stops
                return
            except ClockBehind as e:  # not an outage either: no retry renews on a clock gone back
                self.lost = LeaseError(str(e))
                return
            except PoolError as e:
                # The database may come back before the lease expires: try at the next beat.
                log.warning("lease %s on %s: renewal failed, retrying in %.1fs: %s",
                            self.token[:8], self.serial, interval, e)

    def __enter__(self) -> Self:
        self.start_heartbeat()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.release()
        except LeaseError as e:
            if exc_type is None:
                raise
            log.warning("lease %s on %s: not released (%s) while handling %s", self.token[:8],
                        self.serial, e, getattr(exc_type, "__name__", exc_type))
