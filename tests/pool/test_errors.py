"""A bad pool URL or a database that is down or locked gives a clear error quickly, never a hang."""

from __future__ import annotations

import socket
import sqlite3

import psycopg
import pytest

from farm.errors import PoolError, UsageError
from farm.pool import LeaseRequest, Pool
from tests.support.pool import fake_device, pg_base_url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("url, match", [
    ("mysql://farm@db/farm", "unknown scheme 'mysql'"),
    ("pool.db", "expected sqlite:///PATH or postgresql://"),
    ("sqlite://", "expected sqlite:///PATH"),
    ("sqlite:///:memory:", "several processes share"),
    ("postgresql://farm@[db/farm", "pool url"),
])
def test_bad_url_is_a_usage_error(url, match):
    with pytest.raises(UsageError, match=match):
        Pool.open(url)


def test_unwritable_sqlite_path_is_a_pool_error(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(PoolError, match="cannot open SQLite database"):
        Pool.open(f"sqlite:///{blocker}/pool.db")


def test_sqlite_locked_by_another_process_times_out(tmp_path):
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    with Pool.open(url) as pool:
        pool.sync([fake_device("dev0")])
    other = sqlite3.connect(tmp_path / "pool.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a writer that never commits
    try:
        with Pool.open(url, lock_timeout_s=0.2) as pool:
            with pytest.raises(PoolError, match="cannot start a transaction within 0.2s"):
                pool.acquire(LeaseRequest(), ttl_s=10, timeout_s=0)
            assert [d.device.serial for d in pool.status().devices] == ["dev0"]  # readers go on
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_postgres_down_is_a_pool_error():
    port = free_port()  # nothing listens here
    with pytest.raises(PoolError, match=f"cannot connect to PostgreSQL.*{port}"):
        Pool.open(f"postgresql://postgres@127.0.0.1:{port}/test", connect_timeout_s=2)


def test_postgres_password_is_not_in_messages():
    port = free_port()
    with pytest.raises(PoolError) as err:
        Pool.open(f"postgresql://farm:s3cret@127.0.0.1:{port}/test", connect_timeout_s=2)
    assert "s3cret" not in str(err.value) and "farm:***@" in str(err.value)


@pytest.mark.postgres
def test_postgres_missing_schema_is_named(pg_pool_url):
    url = pg_pool_url.replace("ptefarm_test_", "nosuch_")
    with pytest.raises(PoolError, match="no schema of search_path"):
        Pool.open(url)


@pytest.mark.postgres
def test_postgres_connection_lost_then_recovered(pg_pool_url):
    """The server drops our session (restart, failover): one clear PoolError, then it reconnects."""
    with Pool.open(pg_pool_url) as pool:
        pool.sync([fake_device("dev0")])
        pid = pool.store._connect().info.backend_pid
        with psycopg.connect(pg_base_url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(PoolError, match="pool postgresql://"):
            pool.status()
        assert [d.device.serial for d in pool.status().devices] == ["dev0"]


@pytest.mark.postgres
def test_postgres_pool_lock_held_elsewhere_times_out(pg_pool_url):
    with Pool.open(pg_pool_url) as pool:
        pool.sync([fake_device("dev0")])
    with psycopg.connect(pg_pool_url) as stuck:  # a writer that never commits
        stuck.execute("SELECT * FROM pool_meta FOR UPDATE")
        with Pool.open(pg_pool_url, lock_timeout_s=0.2) as pool:
            with pytest.raises(PoolError, match="pool lock not granted within 0.2s"):
                pool.acquire(LeaseRequest(), ttl_s=10, timeout_s=0)
            assert [d.device.serial for d in pool.status().devices] == ["dev0"]
        stuck.rollback()


def test_the_callers_connect_and_lock_timeouts_reach_the_store(monkeypatch):
    """Pool.open passes both timeouts on: a caller that asked for a 2 s connect timeout (a CLI that
    must answer fast) never waits open_store's default 10 s."""
    import farm.pool.leases as leases

    asked = {}

    class Opened(Exception):
        pass

    def open_store(url, **timeouts):
        asked.update(timeouts, url=url)
        raise Opened

    monkeypatch.setattr(leases, "open_store", open_store)
    with pytest.raises(Opened):
        Pool.open("postgresql://127.0.0.1:1/x", connect_timeout_s=2.0, lock_timeout_s=3.0)
    assert asked == {"url": "postgresql://127.0.0.1:1/x", "connect_timeout_s": 2.0, "lock_timeout_s": 3.0}
