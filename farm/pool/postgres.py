"""PostgreSQL backend (psycopg 3): one pool for many hosts.

Writers serialize on the single ``pool_meta`` row (``SELECT ... FOR UPDATE``): the lock lives in the
schema, so pools in different schemas of one database do not block each other, and it is released by
commit, rollback or a dropped connection (a killed process never keeps it). ``lock_timeout`` and
``connect_timeout`` turn a stuck or unreachable server into a PoolError instead of a hang. The clock is the
server's (``clock_timestamp()``), one clock for every host.

The schema comes from the URL's search_path, e.g.
``postgresql://farm@db/farm?options=-csearch_path%3Dptefarm`` keeps the pool in schema ``ptefarm``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from farm.errors import PoolError, UsageError
from farm.pool.schema import SCHEMA_VERSION, apply_migrations, current_version
from farm.pool.store import Listener, Store, Txn, redact_url


class PostgresStore(Store):
    dialect = "postgresql"
    now_sql = "extract(epoch FROM clock_timestamp())"

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
            with conn.transaction():
                cur = conn.cursor()
                # The clock is read after the lock is granted: "now" is when we hold the pool.
                if write:
                    cur.execute("SELECT schema_version FROM pool_meta WHERE id = 1 FOR UPDATE")
                else:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS now")
                now = cur.fetchone()["now"]
                yield Txn(cur, now, placeholder="%s", notify_channel=self._channel)
        except psycopg.errors.LockNotAvailable as e:
            raise PoolError(f"pool {self.display_url}: pool lock not granted within "
                            f"{self._lock_timeout_s:g}s") from e
        except psycopg.Error as e:
            self._drop_if_broken()
            raise PoolError(f"pool {self.display_url}: {_one_line(e)}") from e

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
                if current_version(Txn(conn.cursor(), 0.0, placeholder="%s"),
                                   self.dialect) == SCHEMA_VERSION:
                    return  # the common case needs no lock
                # Two processes creating the schema at once: serialize them on a per-schema key.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                             (f"ptefarm-pool-migrate:{schema}",))
                apply_migrations(Txn(conn.cursor(), 0.0, placeholder="%s"), self.dialect,
                                 self.display_url)
        except psycopg.Error as e:
            self._drop_if_broken()
            raise PoolError(f"pool {self.display_url}: cannot create the pool schema: "
                            f"{_one_line(e)}") from e

    def listener(self) -> Listener:
        if self._channel is None:
            return Listener()
        try:
            return _PgListener(self.url, self._channel, self._connect_timeout_s)
        except psycopg.Error:
            return Listener()  # polling still works; only slower to notice a grant

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _PgListener(Listener):
    """LISTEN on the pool's channel on a connection of its own; ``dispatch`` NOTIFYs the queue ids it
    granted, so a waiter wakes at once instead of at its next poll, and other waiters go back to
    sleep without a query."""

    pushes = True

    def __init__(self, url: str, channel: str, connect_timeout_s: float):
        self._conn = psycopg.connect(url, autocommit=True,
                                     connect_timeout=max(1, math.ceil(connect_timeout_s)))
        self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

    def wait(self, timeout: float) -> set[int]:
        granted: set[int] = set()
        try:
            for note in self._conn.notifies(timeout=timeout, stop_after=1):
                granted |= {int(x) for x in note.payload.split(",") if x}
        except psycopg.Error:
            time.sleep(timeout)  # the poll that follows reports a dead server properly
        return granted

    def close(self) -> None:
        self._conn.close()


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())
