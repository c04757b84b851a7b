"""The small interface the pool needs from a database, and the code both backends share.

A backend gives two kinds of transaction:
- ``write()``: serialized against every other writer of the same pool, on every host. SQLite takes the
  database write lock up front (``BEGIN IMMEDIATE``); PostgreSQL locks the single ``pool_meta`` row
  (``SELECT ... FOR UPDATE``). All state changes happen inside one, so "never two holders of a device"
  follows from the database, not from any lock in this process.
- ``read()``: a consistent snapshot for status and history; never blocks writers for long.

SQL is written once with ``?`` placeholders and ``RETURNING``, which both SQLite (>= 3.35) and PostgreSQL
understand; the PostgreSQL backend rewrites ``?`` to ``%s``.

Time: every timestamp (lease expiry, queue arrival, event time) is taken from ``Txn.now``, which is
the database server's clock on PostgreSQL, so hosts with skewed clocks agree on when a lease expires, and
the host clock on SQLite, where all processes share one host and one clock by construction.
"""

from __future__ import annotations

import hashlib
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

from farm.errors import PoolError


class PoolLost(PoolError):
    """The pool this process opened is gone: its SQLite file was deleted or replaced, or its
    PostgreSQL tables were dropped (and perhaps created again, empty). Not an outage to wait out:
    every lease taken from it is lost, and the process must not go on as if a new, empty pool at the
    same address were the old one (it would lease devices the old pool's holders still use)."""


class Txn:
    """A transaction: run SQL, get rows as dicts. ``now`` is the pool clock at the transaction start.

    A backend may read the clock lazily (``now`` a callable): PostgreSQL sends the clock query with
    the lock and reads its result with the first statement that waits for one, so that the two share
    a round trip. A statement that should not wait for ``now`` writes ``{now}`` for the pool clock, as
    in ``Store.query_one``: it becomes ``now_sql`` and reads the clock a moment later, never earlier."""

    def __init__(self, cursor: Any, now: float | Callable[[], float], placeholder: str = "?",
                 notify_channel: str | None = None, now_sql: str | None = None,
                 new_cursor: Callable[[], Any] | None = None):
        self._cur = cursor
        self._now: float | None = None if callable(now) else now
        self._read_now = now if callable(now) else None
        self._now_sql = now_sql
        self._new_cursor = new_cursor
        self._placeholder = placeholder
        self._notify_channel = notify_channel
        # Set when devices may newly satisfy waiters (attributes, tags, liveness changed): the pool
        # then matches every available device against the queue. ``freed_serials``: the devices that
        # became available in this transaction, which alone need matching when nothing else changed.
        self.freed = False
        self.freed_serials: set[str] = set()
        # Queue ids granted a lease in this transaction, for the backend to wake after commit.
        self.woken: list[int] = []

    @property
    def now(self) -> float:
        if self._now is None:
            assert self._read_now is not None
            self._now = self._read_now()
        return self._now

    def _sql(self, sql: str) -> str:
        if self._now_sql is not None:
            sql = sql.replace("{now}", self._now_sql)
        return sql if self._placeholder == "?" else sql.replace("?", self._placeholder)

    def run(self, sql: str, params: tuple | list = ()) -> int:
        self._cur.execute(self._sql(sql), tuple(params))
        return self._cur.rowcount

    def all(self, sql: str, params: tuple | list = ()) -> list[dict[str, Any]]:
        self._cur.execute(self._sql(sql), tuple(params))
        return [dict(r) for r in self._cur.fetchall()]

    def rows(self, sql: str, params: tuple | list = ()) -> Iterator[dict[str, Any]]:
        """The rows of one query, converted as they are consumed: for a search that stops at the
        first row it wants, among hundreds (a cursor of its own: other statements may run between
        its rows). Close it (``contextlib.closing``) when stopping early, before the next query."""
        cur = self._new_cursor() if self._new_cursor is not None else self._cur.connection.cursor()
        try:
            cur.execute(self._sql(sql), tuple(params))
            while batch := cur.fetchmany(32):
                for row in batch:
                    yield dict(row)
        finally:
            cur.close()

    def one(self, sql: str, params: tuple | list = ()) -> dict[str, Any] | None:
        rows = self.all(sql, params)
        return rows[0] if rows else None

    def all_of(self, *queries: tuple[str, tuple | list]) -> list[list[dict[str, Any]]]:
        """The rows of several independent statements, in order. Each is sent before any result is
        read: on PostgreSQL (pipeline mode) all of them cost one round trip, not one each."""
        if self._new_cursor is None:
            return [self.all(sql, params) for sql, params in queries]
        cursors = []
        for sql, params in queries:
            cur = self._new_cursor()
            cur.execute(self._sql(sql), tuple(params))
            cursors.append(cur)
        return [[dict(r) for r in cur.fetchall()] for cur in cursors]

    def wake(self, queue_ids: Iterable[int]) -> None:
        """Wake the waiters of these queue entries once this transaction commits (they were granted a
        lease). PostgreSQL: NOTIFY, which the server delivers at commit; SQLite: the store pokes the
        waiters' sockets after its COMMIT. A wake-up is only a hint: a lost one costs the waiter its
        poll interval, never a lease."""
        ids = [int(q) for q in queue_ids]
        self.woken += ids
        if self._notify_channel is not None and ids:
            # One channel per waiter, so that a grant wakes only its waiter (not every listener of
            # the pool); the pool-wide channel too, for listeners of older versions of this code.
            channels = [self._notify_channel, *(pg_queue_channel(self._notify_channel, q)
                                                for q in ids)]
            payloads = [",".join(map(str, ids)), *map(str, ids)]
            self.run("SELECT pg_notify(c, p) FROM unnest(?::text[], ?::text[]) AS t(c, p)",
                     (channels, payloads))

    def insert(self, sql: str, params: tuple | list = ()) -> int:
        """Run an ``INSERT ... RETURNING id`` and return the id."""
        row = self.one(sql, params)
        assert row is not None
        return int(row["id"])


@dataclass
class Where:
    """A query's WHERE clause built a condition at a time, each with its parameters, so that a
    filter a caller may leave out (None) is one line, and the ``?`` stay in step with their values."""

    conditions: list[str] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)

    def add(self, condition: str, *params: Any) -> Where:
        self.conditions.append(condition)
        self.params.extend(params)
        return self

    def equal(self, **columns: Any) -> Where:
        """``column = ?`` for each column given a value; None filters on nothing."""
        for column, value in columns.items():
            if value is not None:
                self.add(f"{column} = ?", value)
        return self

    def sql(self) -> str:
        """`` WHERE a AND b``; empty without a condition."""
        return f" WHERE {' AND '.join(self.conditions)}" if self.conditions else ""


class Listener:
    """Waits for grant notifications. This one only sleeps: waiters poll (the fallback when a backend
    has no wake-up, or it could not be set up)."""

    pushes = False  # True when grants are announced, so that polls are only a fallback
    queue_id: int | None = None  # the queue entry whose grant this listener hears of

    def wait(self, timeout: float) -> set[int]:
        """Block up to ``timeout``; return the queue ids that were granted a lease meanwhile, as far
        as this listener knows (empty: poll to find out)."""
        time.sleep(timeout)
        return set()

    def close(self) -> None:
        pass


class Store(ABC):
    """One pool database. Thread-safe: one connection, used by one thread at a time."""

    dialect: str

    def __init__(self, url: str):
        self.url = url
        self._lock = threading.Lock()  # guards the connection only; exclusion is the database's job
        # Called after each write transaction with how long it held the pool lock (seconds): from
        # the lock granted to the commit done. For measurements (bench/bench_pool_scale.py).
        self.on_write_held: Callable[[float], None] | None = None
        # The identity (pool_meta.pool_id) of the pool this store opened, set by migrate(): every
        # later transaction checks that it still talks to that pool (PoolLost otherwise).
        self.pool_id: str | None = None
        # Seconds this process's view of the pool clock runs ahead of the database's. Always 0 but
        # in tests, which move it to let a TTL run out without sleeping through it (every reading,
        # Txn.now and {now} alike, moves together; other processes keep the database's clock).
        self.clock_offset_s = 0.0

    @property
    def display_url(self) -> str:
        return redact_url(self.url)

    @contextmanager
    def write(self) -> Iterator[Txn]:
        with self._lock, self._transaction(write=True) as txn:
            yield txn

    @contextmanager
    def read(self) -> Iterator[Txn]:
        with self._lock, self._transaction(write=False) as txn:
            yield txn

    # An SQL expression for the database's clock (epoch seconds).
    clock_sql: str

    @property
    def now_sql(self) -> str:
        """The pool clock in SQL, for ``{now}`` in statements (``clock_offset_s`` included)."""
        if not self.clock_offset_s:
            return self.clock_sql
        return f"({self.clock_sql} + {float(self.clock_offset_s)!r})"

    def query_one(self, sql: str, params: tuple = ()) -> dict[str, Any]:
        """One single-row statement outside an explicit transaction: a waiter's cheap poll."""
        with self._lock:
            return self._query_one(sql.replace("{now}", self.now_sql), params)

    @abstractmethod
    def _query_one(self, sql: str, params: tuple) -> dict[str, Any]: ...

    def listener(self, queue_id: int | None = None) -> Listener:
        """Something the waiter of queue entry ``queue_id`` blocks on between polls; opened when a
        request has to wait, before its next poll (so that no grant falls between the two)."""
        return Listener()

    @abstractmethod
    def _transaction(self, *, write: bool) -> Any:
        """A context manager yielding a Txn; commits on success, rolls back on error."""

    @abstractmethod
    def migrate(self) -> None:
        """Create or upgrade the schema, serialized against other processes doing the same."""

    @abstractmethod
    def close(self) -> None: ...


class StoreOwner:
    """An object that owns a Store (``self.store``) and closes it with itself: a Pool, a
    ResultsStore. A context manager: ``with Pool.open(url) as pool:`` closes the store on leaving."""

    store: Store

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    userinfo = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{netloc[-1]}"))


def pg_queue_channel(pool_channel: str, queue_id: int) -> str:
    """The NOTIFY channel of one queue entry: within PostgreSQL's 63-byte identifiers whatever the
    schema name's length (the pool channel is hashed, the queue id kept whole)."""
    digest = hashlib.blake2b(pool_channel.encode(), digest_size=8).hexdigest()
    return f"ptefarm_q{int(queue_id)}_{digest}"
