"""SQLite backend: one file, safe for many processes on one host.

WAL lets readers (``farm pool status``) run beside the single writer; every pool change is a
``BEGIN IMMEDIATE`` transaction, which takes the database's write lock before reading anything, so two
processes can never both see a device as available and both take it. ``busy_timeout`` makes a writer
wait for the lock instead of failing at once; past it, the caller gets a PoolError, not a hang.

A waiter is woken by the releaser that granted it a device, through a Unix datagram socket
(``farm.db.wakeup``), sent after the grant's COMMIT so that the woken waiter's read sees it.

The pool is the file this process opened, not whatever file has its path later: an open connection
keeps writing to a deleted file, and a process that opens the path afterwards would create a fresh,
empty pool and lease the devices the first one's holders still use. So each transaction checks that
the path still names the file it opened (a ``stat``, no I/O on the database: PoolLost otherwise),
and the pool's identity (``pool_meta.pool_id``) is also kept beside the file (``<file>.id``): a
process that finds that note but not the database, or a database of another identity, refuses to
open it rather than start a new pool there (remove the note to start afresh on purpose).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from farm.db.base import Listener, PoolLost, Store, Txn
from farm.db.migrations import SCHEMA_VERSION, apply_migrations, current_version, pool_id
from farm.db.wakeup import SocketAddresses, SocketWaker
from farm.errors import PoolError, UsageError

log = logging.getLogger(__name__)
# Write transactions between two checkpoints of the WAL (SQLite's own default is ~1,000 pages).
CHECKPOINT_EVERY = 200


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
    clock_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, url: str, *, lock_timeout_s: float = 30.0):
        super().__init__(url)
        self.path = sqlite_path(url)
        self._lock_timeout_s = lock_timeout_s
        self._conn: sqlite3.Connection | None = None
        self._waker = SocketWaker(SocketAddresses(self.path))
        self._file: tuple[int, int] | None = None  # (device, inode) of the file this store opened
        self._writes_since_checkpoint = 0

    @property
    def id_note(self) -> Path:
        """The file beside the database that remembers the pool's identity."""
        return self.path.with_name(self.path.name + ".id")

    def _check_file(self) -> None:
        """PoolLost unless the path still names the database file this store opened."""
        if self._file is None:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise PoolLost(f"pool {self.url}: the database file {self.path} was deleted under this "
                           f"process; its leases are lost") from None
        except OSError as e:
            raise PoolError(f"pool {self.url}: cannot stat {self.path}: {e}") from e
        if (st.st_dev, st.st_ino) != self._file:
            raise PoolLost(f"pool {self.url}: the database file {self.path} was replaced under this "
                           f"process (another file now has its path); its leases are lost")

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
            # No checkpoint inside a commit: it copies the WAL into the database and fsyncs, which
            # at farm scale was the pool lock's longest holds; done after the commit instead
            # (_checkpoint), where writers carry on beside it.
            conn.execute("PRAGMA wal_autocheckpoint=0")
        except (sqlite3.Error, OSError) as e:
            raise PoolError(f"pool {self.url}: cannot open SQLite database {self.path}: {e}") from e
        self._conn = conn
        return conn

    def _query_one(self, sql: str, params: tuple) -> dict[str, Any]:
        conn = self._connect()
        self._check_file()
        try:
            return dict(conn.execute(sql, params).fetchone())
        except sqlite3.Error as e:
            raise PoolError(f"pool {self.url}: {e}") from e

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Txn]:
        conn = self._connect()
        self._check_file()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as e:
            raise PoolError(f"pool {self.url}: cannot start a transaction within "
                            f"{self._lock_timeout_s:g}s: {e}") from e
        try:
            granted = time.perf_counter()
            txn = Txn(conn.cursor(), time.time() + self.clock_offset_s, now_sql=self.now_sql)
            yield txn
            conn.execute("COMMIT")
            if write and self.on_write_held is not None:
                self.on_write_held(time.perf_counter() - granted)
        except sqlite3.Error as e:
            self._rollback(conn)
            raise PoolError(f"pool {self.url}: {e}") from e
        except BaseException:
            self._rollback(conn)
            raise
        if txn.woken:
            self._waker.wake(txn.woken)
        if write:
            self._writes_since_checkpoint += 1
            if self._writes_since_checkpoint >= CHECKPOINT_EVERY:
                self._checkpoint(conn)

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        """Copy the WAL back into the database without blocking writers (PASSIVE), outside any
        transaction. Best effort: a checkpoint that cannot finish now finishes at a later one."""
        self._writes_since_checkpoint = 0
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as e:
            log.debug("pool %s: checkpoint: %s", self.url, e)

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def migrate(self) -> None:
        note = self._read_note()
        if note is not None and not self.path.exists():
            raise PoolLost(f"pool {self.url}: the database file {self.path} is gone, but {self.id_note} "
                           f"says pool {note} was there: its holders may still use their devices, "
                           f"and a new pool would lease them again. If the pool is meant to start "
                           f"afresh, remove {self.id_note}")
        self._connect()
        st = os.stat(self.path)
        self._file = (st.st_dev, st.st_ino)
        with self.read() as txn:
            ready = current_version(txn, self.dialect) == SCHEMA_VERSION
            identity = pool_id(txn) if ready else None
        if identity is None:  # the common case needs no write lock
            with self.write() as txn:
                apply_migrations(txn, self.dialect, self.url)
                identity = pool_id(txn)
        if note is not None and note != identity:
            raise PoolLost(f"pool {self.url}: {self.path} is pool {identity}, but {self.id_note} says "
                           f"pool {note} was there: the file was replaced, and the old pool's holders "
                           f"may still use their devices. If the new pool is meant, remove "
                           f"{self.id_note}")
        if note is None:
            self._write_note(identity)
        self.pool_id = identity

    def _read_note(self) -> str | None:
        try:
            return self.id_note.read_text().strip() or None
        except (FileNotFoundError, NotADirectoryError):
            return None  # no pool here yet (opening it says what is wrong with the path, if anything)
        except OSError as e:
            raise PoolError(f"pool {self.url}: cannot read {self.id_note}: {e}") from e

    def _write_note(self, identity: str) -> None:
        """Write the note atomically (two processes creating the pool write the same id)."""
        tmp = self.id_note.with_name(f"{self.id_note.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(identity + "\n")
            os.replace(tmp, self.id_note)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise PoolError(f"pool {self.url}: cannot write {self.id_note}: {e}") from e

    def listener(self, queue_id: int | None = None) -> Listener:
        return self._waker.listener(queue_id)

    def close(self) -> None:
        self._waker.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
