"""PostgreSQL backend (psycopg 3): one pool for many hosts.

Writers serialize on the single ``pool_meta`` row (``SELECT ... FOR UPDATE``): the lock lives in the
schema, so pools in different schemas of one database do not block each other, and it is released by
commit, rollback or a dropped connection (a killed process never keeps it). ``lock_timeout`` and
``connect_timeout`` turn a stuck or unreachable server into a PoolError instead of a hang. The clock is the
server's (``clock_timestamp()``), one clock for every host.

The schema comes from the URL's search_path, e.g.
``postgresql://farm@db/farm?options=-csearch_path%3Dptefarm`` keeps the pool in schema ``ptefarm``.

Every transaction checks that the pool is still the one this process opened: the pool's identity
(``pool_meta.pool_id``) comes back with the clock, in the round trip that reads the clock anyway, and
another identity (the schema dropped and created again) or no pool tables at all is PoolLost.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from farm.db.base import Listener, PoolLost, Store, Txn, pg_queue_channel, redact_url
from farm.db.migrations import SCHEMA_VERSION, apply_migrations, current_version, pool_id
from farm.errors import PoolError, UsageError

# Listening connections a process keeps between waits: one per thread that waits at a time.
MAX_IDLE_LISTENERS = 4


class PostgresStore(Store):
    dialect = "postgresql"
    clock_sql = "extract(epoch FROM clock_timestamp())"
    # True: commit without the WAL flush and flush right after, outside the pool lock (see
    # _transaction). Off by default: bench/bench_pool.py (backend postgres-flush) measured it better
    # at p99 but worse at p50 and utilisation on a 2-core host saturated by other work; decide on a
    # quiet host (issue 13 item 5).
    flush_outside_lock = False

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0, lock_timeout_s: float = 30.0):
        super().__init__(url)
        try:
            conninfo_to_dict(url)
        except psycopg.Error as e:
            raise UsageError(f"pool url {redact_url(url)!r}: {e}") from None
        self._connect_timeout_s = connect_timeout_s
        self._lock_timeout_s = lock_timeout_s
        self._conn: psycopg.Connection | None = None
        self._channel: str | None = None  # NOTIFY channel of this pool's schema, set by migrate()
        # Listening connections of finished waits, reused by the next (see _recycle).
        self._idle_listen: list[psycopg.Connection] = []
        self._listen_lock = threading.Lock()
        self._closed = False

    def _connect(self) -> psycopg.Connection:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        try:
            conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row,
                                   connect_timeout=max(1, math.ceil(self._connect_timeout_s)))
            conn.execute(f"SET lock_timeout = '{int(self._lock_timeout_s * 1000)}ms'")
        except psycopg.Error as e:
            raise PoolError(f"pool {self.display_url}: cannot connect to PostgreSQL: "
                            f"{_one_line(e)}") from e
        self._conn = conn
        return conn

    def _query_one(self, sql: str, params: tuple) -> dict[str, Any]:
        conn = self._connect()
        try:
            row = conn.execute(sql.replace("?", "%s"), params).fetchone()
        except psycopg.Error as e:
            self._drop_if_broken()
            raise PoolError(f"pool {self.display_url}: {_one_line(e)}") from e
        assert row is not None
        return row

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Txn]:
        conn = self._connect()
        try:
            # Pipeline mode: statements whose results nobody reads (UPDATE, INSERT, NOTIFY) go out
            # without waiting for their reply; only a fetch waits. A release that grants a waiter
            # is then ~8 round trips instead of 17, and the pool lock is held that much shorter.
            # (Statements still run in order on the server: the clock below is read after the lock.)
            with conn.pipeline(), conn.transaction():
                cur = conn.cursor()
                # The clock is read after the lock is granted: "now" is when we hold the pool.
                if write:
                    cur.execute("SELECT schema_version FROM pool_meta WHERE id = 1 FOR UPDATE")
                else:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                # With flush_outside_lock, commit without waiting for the WAL flush (set_config(...,
                # true): this transaction only, read with the clock at no extra round trip): the
                # pool lock is held until commit, so otherwise every pool change holds it across an
                # fsync (milliseconds on a busy disk). _make_durable then flushes outside the lock.
                # Read lazily: the first statement whose result the body waits for brings the
                # clock's with it, in the same round trip.
                # The pool's identity comes with the clock: checked at no extra round trip.
                clock = conn.cursor()
                clock.execute(f"SELECT ({self.clock_sql})::float8 AS now, "
                              "set_config('synchronous_commit', %s, true), "
                              "(SELECT pool_id FROM pool_meta WHERE id = 1) AS pool_id",
                              ("off" if self.flush_outside_lock else "on",))
                seen: list[dict[str, Any]] = []

                def read_clock() -> float:
                    if not seen:
                        seen.append(clock.fetchone())
                        self._check_identity(seen[0]["pool_id"])
                    return seen[0]["now"] + self.clock_offset_s

                yield Txn(cur, read_clock, placeholder="%s", notify_channel=self._channel,
                          now_sql=self.now_sql, new_cursor=conn.cursor)
                # Before the commit: a body that never read the clock is checked too (its result
                # came back with the body's first read: no round trip of its own, but for a body
                # that read nothing).
                granted_at = read_clock() - self.clock_offset_s  # the server's clock, lock granted
            if write and self.on_write_held is not None:
                self.on_write_held(time.time() - granted_at)  # one host's clock: the server is local
            if self.flush_outside_lock:
                self._make_durable(conn)
        except psycopg.errors.LockNotAvailable as e:
            raise PoolError(f"pool {self.display_url}: pool lock not granted within "
                            f"{self._lock_timeout_s:g}s") from e
        except psycopg.errors.UndefinedTable as e:
            raise PoolLost(f"pool {self.display_url}: the pool's tables are gone (its schema was "
                           f"dropped under this process; {_one_line(e)}): its leases are lost") from e
        except psycopg.Error as e:
            self._drop_if_broken()
            raise PoolError(f"pool {self.display_url}: {_one_line(e)}") from e

    def _check_identity(self, seen: str | None) -> None:
        if self.pool_id is not None and seen != self.pool_id:
            raise PoolLost(f"pool {self.display_url}: it is not the pool this process opened (pool "
                           f"{self.pool_id}, now {seen or 'none'}: its schema was dropped and "
                           f"created again): its leases are lost")

    @staticmethod
    def _make_durable(conn: psycopg.Connection) -> None:
        """Wait until everything committed so far, by anyone, is on disk, before the caller acts on
        what its transaction did or saw: a synchronous commit of a transaction with an id flushes
        the WAL up to its own commit record, which follows every earlier commit. It runs outside
        the pool lock, so concurrent flushes share an fsync (group commit). A caller thus never
        acts on a grant, release or renewal that a server crash could undo, although other
        sessions may see a commit a moment before it is durable (they flush before acting too)."""
        conn.execute("SELECT txid_current()")

    def _drop_if_broken(self) -> None:
        # A broken connection (server restarted, network cut) is replaced on the next transaction.
        if self._conn is not None and (self._conn.closed or self._conn.broken):
            self._conn = None

    def migrate(self) -> None:
        conn = self._connect()
        try:
            with conn.transaction():
                schema = conn.execute("SELECT current_schema() AS s").fetchone()["s"]
                if schema is None:
                    path = conn.execute("SHOW search_path").fetchone()["search_path"]
                    raise PoolError(f"pool {self.display_url}: no schema of search_path "
                                    f"({path}) exists; create it first")
                self._channel = f"ptefarm_pool_{schema}"[:63]
                txn = Txn(conn.cursor(), 0.0, placeholder="%s")
                if current_version(txn, self.dialect) == SCHEMA_VERSION:
                    self.pool_id = pool_id(txn)
                    return  # the common case needs no lock
                # Two processes creating the schema at once: serialize them on a per-schema key.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                             (f"ptefarm-pool-migrate:{schema}",))
                apply_migrations(txn, self.dialect, self.display_url)
                self.pool_id = pool_id(txn)
        except psycopg.Error as e:
            self._drop_if_broken()
            raise PoolError(f"pool {self.display_url}: cannot create the pool schema: "
                            f"{_one_line(e)}") from e

    def listener(self, queue_id: int | None = None) -> Listener:
        if self._channel is None or queue_id is None:
            return Listener()
        channel = pg_queue_channel(self._channel, queue_id)
        with self._listen_lock:
            conn = self._idle_listen.pop() if self._idle_listen else None
        try:
            if conn is None:
                conn = psycopg.connect(self.url, autocommit=True,
                                       connect_timeout=max(1, math.ceil(self._connect_timeout_s)))
            # One round trip: forget the previous waiter's channel, listen on this one's. (Its
            # leftover notifications carry another queue id and are ignored.)
            name = sql.Identifier(channel).as_string(conn)
            conn.execute(f"UNLISTEN *; LISTEN {name}")
        except psycopg.Error:
            if conn is not None:
                conn.close()
            return Listener()  # polling still works; only slower to notice a grant
        return _PgListener(self, conn, queue_id)

    def _recycle(self, conn: psycopg.Connection) -> None:
        """Keep a listener's connection for the next wait of this process: a new connection costs
        the server a backend process and this host a few milliseconds of CPU."""
        if conn.closed or conn.broken:
            return
        with self._listen_lock:
            if not self._closed and len(self._idle_listen) < MAX_IDLE_LISTENERS:
                self._idle_listen.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._listen_lock:
            self._closed = True
            idle, self._idle_listen = self._idle_listen, []
        for conn in idle:
            conn.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _PgListener(Listener):
    """LISTEN on the waiter's own channel (``pg_queue_channel``), on a connection of its own; ``Txn.wake``
    NOTIFYs it when dispatch grants the waiter a device, so that the waiter wakes at once instead of
    at its next poll, and no other waiter wakes at all."""

    pushes = True

    def __init__(self, store: PostgresStore, conn: psycopg.Connection, queue_id: int):
        self.queue_id = queue_id
        self._store = store
        self._conn: psycopg.Connection | None = conn

    def wait(self, timeout: float) -> set[int]:
        granted: set[int] = set()
        if self._conn is None:
            return super().wait(timeout)
        try:
            for note in self._conn.notifies(timeout=timeout, stop_after=1):
                granted |= {int(x) for x in note.payload.split(",") if x.isdigit()}
        except psycopg.Error:
            time.sleep(timeout)  # the poll that follows reports a dead server properly
        return granted

    def close(self) -> None:
        if self._conn is not None:
            self._store._recycle(self._conn)
            self._conn = None


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())
