"""SQLite backend: one file, safe for many processes on one host.

WAL lets readers (``farm pool status``) run beside the single writer; every pool change is a
``BEGIN IMMEDIATE`` transaction, which takes the database's write lock before reading anything, so two
processes can never both see a device as available and both take it. ``busy_timeout`` makes a writer
wait for the lock instead of failing at once; past it, the caller gets a PoolError, not a hang.

A waiter is woken by the releaser that granted it a device, through a Unix datagram socket
(``farm.db.wakeup``), sent after the grant's COMMIT so that the woken waiter's read sees it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from farm.db.base import Listener, Store, Txn
from farm.db.migrations import SCHEMA_VERSION, apply_migrations, current_version
from farm.db.wakeup import SocketAddresses, SocketWaker
from farm.errors import PoolError, UsageError


def sqlite_path(url: str) -> Path:
    """``sqlite:///rel.db``, ``sqlite:////abs/pool.db`` or ``sqlite:///~/pool.db`` -> the file."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise UsageError(f"pool url {url!r}: expected sqlite:///PATH (sqlite:////abs/path for an "
                         f"absolute path)")
    rest = url[len(prefix):]
    if rest.startswith(":memory:") or "?" in rest:
        raise UsageError(f"pool url {url!r}: the pool must be a file that several processes share")
    return Path(rest).expanduser()


class SqliteStore(Store):
    dialect = "sqlite"
    # The host clock, as time.time() reads it (julianday has millisecond resolution).
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, url: str, *, lock_timeout_s: float = 30.0):
        super().__init__(url)
        self.path = sqlite_path(url)
        self._lock_timeout_s = lock_timeout_s
        self._conn: sqlite3.Connection | None = None
        self._waker = SocketWaker(SocketAddresses(self.path))

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=self._lock_timeout_s, isolation_level=None,
                                   check_same_thread=False)  # our Store lock serializes threads
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a committed lease survives a process crash; a power cut may lose
            # the last transactions, which only delays a lease's expiry handling. Much faster.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
        except (sqlite3.Error, OSError) as e:
            raise PoolError(f"pool {self.url}: cannot open SQLite database {self.path}: {e}") from e
        self._conn = conn
        return conn

    def _query_one(self, sql: str, params: tuple) -> dict[str, Any]:
        try:
            return dict(self._connect().execute(sql, params).fetchone())
        except sqlite3.Error as e:
            raise PoolError(f"pool {self.url}: {e}") from e

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Txn]:
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as e:
            raise PoolError(f"pool {self.url}: cannot start a transaction within "
                            f"{self._lock_timeout_s:g}s: {e}") from e
        try:
            txn = Txn(conn.cursor(), time.time(), now_sql=self.now_sql)
            yield txn
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._rollback(conn)
            raise PoolError(f"pool {self.url}: {e}") from e
        except BaseException:
            self._rollback(conn)
            raise
        if txn.woken:
            self._waker.wake(txn.woken)

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def migrate(self) -> None:
        with self.read() as txn:
            if current_version(txn, self.dialect) == SCHEMA_VERSION:
                return  # the common case needs no write lock
        with self.write() as txn:
            apply_migrations(txn, self.dialect, self.url)

    def listener(self, queue_id: int | None = None) -> Listener:
        return self._waker.listener(queue_id)

    def close(self) -> None:
        self._waker.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
