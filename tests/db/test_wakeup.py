"""Waiters are woken by the release that grants them a device (farm/pool/wakeup.py), on both backends;
a lost or garbled wake-up only leaves them to their poll. Deadlines here are generous bounds that
tell a wake-up from a poll (poll intervals of seconds), not timing benchmarks."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from farm.db.base import Listener, Txn, pg_queue_channel
from farm.db.wakeup import SocketAddresses, SocketListener, SocketWaker
from farm.pool import Holder, LeaseRequest, Pool
from farm.pool import leases as leases_mod
from tests.support.pool import fake_device

SLOW_POLL_S = 5.0  # a waiter that only polled would take >= 2.5 s (jittered 0.5x-1.5x)
WOKEN_WITHIN_S = 2.0


class Waiter:
    """``acquire`` in a thread on a Pool of its own (as another process would), reporting when it
    has opened its listener and when it got its lease."""

    def __init__(self, url: str, poll_s: float):
        self.pool = Pool.open(url, poll_s=poll_s)
        self.listening = threading.Event()
        self.queue_id: int | None = None
        self.lease: Any = None
        self.got_at: float | None = None
        self.error: BaseException | None = None
        original = self.pool.store.listener

        def listener(queue_id: int | None = None) -> Listener:
            made = original(queue_id)
            self.queue_id = queue_id
            self.listening.set()
            return made

        self.pool.store.listener = listener  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.lease = self.pool.acquire(LeaseRequest(), Holder.current(purpose="waiter"),
                                           ttl_s=60, timeout_s=60)
            self.got_at = time.monotonic()
        except BaseException as e:  # reported by join()
            self.error = e

    def start(self) -> Waiter:
        self._thread.start()
        assert self.listening.wait(30), "the waiter never queued"
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the waiter did not get the device within {timeout}s"
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        if self.lease is not None:
            self.pool.release(self.lease.token)
        self.pool.close()


@contextmanager
def one_device_held(url: str) -> Iterator[tuple[Pool, Any]]:
    with Pool.open(url) as pool:
        pool.sync([fake_device("w0")])
        yield pool, pool.acquire(LeaseRequest(), Holder.current(purpose="holder"), ttl_s=60)


def test_release_wakes_the_waiter_long_before_its_poll(pool_url):
    with one_device_held(pool_url) as (pool, held):
        waiter = Waiter(pool_url, poll_s=SLOW_POLL_S).start()
        try:
            time.sleep(0.2)  # let it settle into its wait (past its first poll)
            released_at = time.monotonic()
            pool.release(held.token)
            waiter.join(30)
            assert waiter.lease.serial == "w0"
            assert waiter.got_at - released_at < WOKEN_WITHIN_S, \
                f"woken after {waiter.got_at - released_at:.2f}s: the poll found it, not a wake-up"
        finally:
            waiter.close()


def test_a_lost_wake_up_still_ends_in_a_poll(pool_url, monkeypatch):
    monkeypatch.setattr(leases_mod, "PUSHED_POLL_S", 0.3)
    with one_device_held(pool_url) as (pool, held):
        # No backend wakes anybody: the grant must be found by polling.
        monkeypatch.setattr(Txn, "wake", lambda self, queue_ids: None)
        waiter = Waiter(pool_url, poll_s=0.3).start()
        try:
            pool.release(held.token)
            waiter.join(30)
            assert waiter.lease.serial == "w0"
        finally:
            waiter.close()


def _send_garbage(pool: Pool, queue_id: int) -> None:
    """Wake-ups that are not ours to trust: junk, and another queue entry's id."""
    store: Any = pool.store
    if store.dialect == "sqlite":
        address = SocketAddresses(store.path).of(queue_id)
        assert address is not None
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            for junk in (b"\xff\x00garbage", b"", str(queue_id + 1000).encode()):
                s.sendto(junk, address)
    else:
        channel = pg_queue_channel(store._channel, queue_id)
        with store._connect().transaction():
            for junk in ("garbage", "", str(queue_id + 1000)):
                store._conn.execute("SELECT pg_notify(%s, %s)", (channel, junk))


def test_a_garbled_wake_up_is_ignored(pool_url):
    with one_device_held(pool_url) as (pool, held):
        waiter = Waiter(pool_url, poll_s=SLOW_POLL_S).start()
        try:
            time.sleep(0.2)
            _send_garbage(pool, waiter.queue_id)
            time.sleep(0.3)
            assert waiter.lease is None and waiter.error is None, "woken by garbage"
            released_at = time.monotonic()
            pool.release(held.token)
            waiter.join(30)
            assert waiter.got_at - released_at < WOKEN_WITHIN_S
        finally:
            waiter.close()


def test_no_double_holds_when_wake_ups_drive_the_handoffs(pool_url):
    """Eight threads (each with its own Pool) on two devices; they poll only every few seconds, so
    the handoffs are the wake-ups' doing. Every hold is recorded and checked for overlaps."""
    with Pool.open(pool_url) as pool:
        pool.sync([fake_device("d0"), fake_device("d1")])
    holds: list[tuple[str, float, float]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def contend() -> None:
        try:
            with Pool.open(pool_url, poll_s=SLOW_POLL_S) as own:
                for _ in range(4):
                    lease = own.acquire(LeaseRequest(), Holder.current(purpose="contend"),
                                        ttl_s=60, timeout_s=60)
                    start = time.monotonic()
                    time.sleep(0.01)
                    end = time.monotonic()
                    own.release(lease.token)
                    with lock:
                        holds.append((lease.serial, start, end))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=contend, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(holds) == 32
    for serial in ("d0", "d1"):
        mine = sorted((s, e) for d, s, e in holds if d == serial)
        overlaps = [(a, b) for a, b in zip(mine, mine[1:]) if b[0] < a[1]]
        assert not overlaps, f"{serial} held twice at once: {overlaps}"


def test_socket_listener_hears_its_queue_id_only(tmp_path):
    db = tmp_path / "pool.db"
    db.touch()
    addresses = SocketAddresses(db)
    waker = SocketWaker(addresses)
    listener = waker.listener(7)
    try:
        assert isinstance(listener, SocketListener) and listener.pushes
        assert listener.wait(0.0) == set()
        waker.wake([8, 9])  # nobody listens for these: a silent no-op
        assert listener.wait(0.05) == set()
        waker.wake([7])
        assert listener.wait(5) == {7}
        # A second waiter cannot take the same address: it falls back to polling.
        second = waker.listener(7)
        assert type(second) is Listener and not second.pushes
    finally:
        listener.close()
        waker.close()


def test_without_abstract_sockets_waiters_poll(tmp_path, monkeypatch):
    from farm.db import wakeup

    monkeypatch.setattr(wakeup, "ABSTRACT_SOCKETS", False)
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    monkeypatch.setattr(leases_mod, "PUSHED_POLL_S", 0.1)
    with Pool.open(url, poll_s=0.05) as pool:
        assert type(pool.store.listener(1)) is Listener
    with one_device_held(url) as (pool, held):
        waiter = Waiter(url, poll_s=0.05).start()
        try:
            pool.release(held.token)
            waiter.join(30)
        finally:
            waiter.close()


@pytest.mark.postgres
def test_postgres_reuses_its_listening_connection(pg_pool_url):
    with Pool.open(pg_pool_url) as pool:
        first = pool.store.listener(1)
        conn = first._conn
        first.close()
        second = pool.store.listener(2)
        try:
            assert second._conn is conn, "a wait should not cost a new server connection"
            assert second.queue_id == 2
        finally:
            second.close()
