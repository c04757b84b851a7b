"""The pool notices its own loss: a SQLite file deleted or replaced, or a PostgreSQL schema dropped
and created again, under processes that hold leases from it is PoolLost for every one of them (their
heartbeat marks the lease lost), and never a fresh, empty pool that leases their devices again."""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from farm.db.base import PoolLost
from farm.errors import LeaseLost, LeaseTimeout
from farm.pool import LeaseRequest, Pool
from farm.procs import wait_until
from tests.support.pool import PROMPT_S, fake_device


def _seed(url: str) -> Pool:
    pool = Pool.open(url, poll_s=0.02)
    pool.sync([fake_device("dev0")])
    return pool


def test_a_deleted_pool_file_is_lost_for_its_holder_and_never_created_afresh(sqlite_pool_url, tmp_path):
    pool = _seed(sqlite_pool_url)
    try:
        lease = pool.acquire(LeaseRequest(), ttl_s=3, heartbeat_s=0.2)
        lease.start_heartbeat()
        db = Path(sqlite_pool_url.removeprefix("sqlite:///"))
        db.unlink()  # as `rm pool.db` would: the -wal and -shm files stay

        with pytest.raises(PoolLost, match="was deleted"):
            pool.status()
        assert wait_until(lambda: lease.lost is not None, timeout=PROMPT_S)
        with pytest.raises(LeaseLost, match="deleted"):
            lease.check()
        lease.stop_heartbeat()

        # Another process opening the path gets an error, not an empty pool to lease dev0 from.
        with pytest.raises(PoolLost, match="is gone.*remove"):
            Pool.open(sqlite_pool_url)
        assert not db.exists()
    finally:
        pool.close()
    # Starting afresh on purpose: remove the note, as the message says.
    Path(f"{db}.id").unlink()
    Pool.open(sqlite_pool_url).close()


def test_a_replaced_pool_file_is_lost_for_its_holder_and_refused_to_newcomers(sqlite_pool_url,
                                                                             tmp_path):
    pool = _seed(sqlite_pool_url)
    other_url = f"sqlite:///{tmp_path / 'other' / 'pool.db'}"
    _seed(other_url).close()  # another pool, dev0 available in it
    try:
        lease = pool.acquire(LeaseRequest(), ttl_s=30, heartbeat_s=0.2)
        db = Path(sqlite_pool_url.removeprefix("sqlite:///"))
        # (A replaced file under a live WAL reads as the WAL's pool: checkpoint it first, so that
        # the path then holds the other pool alone.)
        with closing(sqlite3.connect(db)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        os.replace(tmp_path / "other" / "pool.db", db)

        with pytest.raises(PoolLost, match="was replaced"):
            lease.renew()
        with pytest.raises(PoolLost, match="was replaced"):
            pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0)
    finally:
        pool.close()
    # A newcomer finds another pool than the one that was there: refused, dev0 not leased again.
    with pytest.raises(PoolLost, match="file was replaced"):
        Pool.open(sqlite_pool_url)


@pytest.mark.postgres
@pytest.mark.parametrize("recreated", [True, False], ids=["recreated", "dropped"])
def test_a_dropped_postgres_schema_is_lost_for_its_holder(pg_pool_url, recreated):
    """A schema dropped and created again (a fresh pool there, dev0 available in it) or only
    dropped: the holder's next renewal is PoolLost, and its heartbeat marks the lease lost."""
    pool = _seed(pg_pool_url)
    try:
        lease = pool.acquire(LeaseRequest(), ttl_s=30, heartbeat_s=0.2)
        with psycopg.connect(pg_pool_url, autocommit=True) as admin:
            schema = admin.execute("SELECT current_schema()").fetchone()[0]
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
            admin.execute(f'CREATE SCHEMA "{schema}"')
        if recreated:
            newcomer = _seed(pg_pool_url)
            newcomer.close()
        with pytest.raises(PoolLost, match="created again" if recreated else "tables are gone"):
            lease.renew()
        with pytest.raises(PoolLost):
            pool.status()
        lease.start_heartbeat()
        assert wait_until(lambda: lease.lost is not None, timeout=PROMPT_S)
        lease.stop_heartbeat()
        with pytest.raises(LeaseLost):
            lease.check()
    finally:
        pool.close()


def test_an_unchanged_pool_opens_and_leases_as_before(pool_url):
    """The identity check costs nothing visible: a pool reopened many times is the same pool."""
    first = _seed(pool_url)
    try:
        with Pool.open(pool_url) as again:
            assert again.store.pool_id == first.store.pool_id is not None
            with again.acquire(LeaseRequest(), ttl_s=30):
                pass
        with first.acquire(LeaseRequest(), ttl_s=30):
            pass
    finally:
        first.close()


def test_a_device_fenced_by_a_lease_of_another_pool_is_held_back_for_a_ttl(pool_url):
    """Pool and note deleted, a fresh pool at the path knows nothing of the old holders, who still
    use their devices until their heartbeat notices (a third of their TTL): a device whose fence
    names a lease this pool never granted is held back for a TTL, once, never leased at once. A fence
    of this pool's own (a lease that ended) holds nothing."""
    from farm.pool import Holder
    from tests.support.pool import HandClock

    foreign = "f0" * 16
    pool = Pool.open(pool_url, poll_s=0.02)
    clock = HandClock(pool=pool)
    try:
        pool.sync([replace(fake_device("dev0"), fence=foreign)])
        [status] = pool.status().devices
        assert status.device.state == "leased" and status.lease is not None
        assert "fenced by another pool's lease f0f0f0f0" in status.lease.holder.purpose
        with pytest.raises(LeaseTimeout):
            pool.acquire(LeaseRequest(), Holder.current(), ttl_s=30, timeout_s=0)
        clock.t += pool.default_ttl_s + 1  # the hold expires as a lease does
        pool.sync([replace(fake_device("dev0"), fence=foreign)])  # seen again: within the liveness bound
        lease = pool.acquire(LeaseRequest(), Holder.current(), ttl_s=30, timeout_s=0)
        pool.release(lease.token)
        assert pool.status().devices[0].device.state == "available"  # the same fence: not held again
        ours = pool.acquire(LeaseRequest(), Holder.current(), ttl_s=30, timeout_s=0)
        pool.release(ours.token)
        pool.sync([replace(fake_device("dev0"), fence=ours.token)])  # our own fence, left behind
        assert pool.status().devices[0].device.state == "available"
        kinds = [e.kind for e in pool.history(serial="dev0", limit=None)]
        assert kinds.count("expired") == 1
    finally:
        pool.close()


def test_a_fence_token_is_never_shown():
    """The probe reads the fence for the pool alone: discovery's record, as `farm devices --json`
    and the pool's attributes show it, leaves the token out."""
    info = replace(fake_device("dev0"), fence="ab" * 16)
    assert "fence" not in info.to_dict() and "ab" * 16 not in repr(info)
