"""The store under the pool (farm/pool/store.py and its backends), on SQLite and PostgreSQL:

- ``Txn.all_of`` gives each statement's rows, in order (PostgreSQL sends them all before reading any:
  one round trip);
- ``Txn.rows`` yields a query's rows in order as they are consumed, may be stopped early and other
  statements run meanwhile, and sees the transaction's own writes;
- a write transaction's clock is read after its lock is granted, although PostgreSQL reads it lazily
  (with the first result the body waits for): "now" is never earlier than the previous writer's commit.
"""

from __future__ import annotations

import contextlib
import threading
import time

from farm.db.connect import open_store


def test_all_of_gives_each_statements_rows_in_order(pool_url):
    store = open_store(pool_url)
    try:
        with store.write() as txn:
            txn.run("INSERT INTO devices (serial, server, state, state_since, first_seen, last_seen, "
                    "soc) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    ("s1", "127.0.0.1:5037", "available", 0.0, 0.0, 0.0, "SM8650"))
            empty, devices, numbers = txn.all_of(
                ("SELECT serial FROM devices WHERE serial = ?", ("nope",)),
                ("SELECT serial, soc FROM devices WHERE serial = ?", ("s1",)),
                ("SELECT 1 AS a UNION ALL SELECT 2 ORDER BY a", ()))
            assert txn.now > 0
        assert empty == []
        assert devices == [{"serial": "s1", "soc": "SM8650"}]
        assert numbers == [{"a": 1}, {"a": 2}]
    finally:
        store.close()


def test_rows_are_read_as_consumed_and_may_stop_early(pool_url):
    store = open_store(pool_url)
    try:
        with store.write() as txn:
            for i in range(100):  # more than one fetch's worth
                txn.run("INSERT INTO devices (serial, server, state, state_since, first_seen, "
                        "last_seen, soc) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (f"s{i:03d}", "127.0.0.1:5037", "available", float(i), 0.0, 0.0, "SM8650"))
            everything = [r["serial"] for r in txn.rows("SELECT serial FROM devices ORDER BY serial")]
            assert everything == [f"s{i:03d}" for i in range(100)]
            with contextlib.closing(txn.rows("SELECT serial FROM devices WHERE state_since >= ? "
                                             "ORDER BY state_since", (40.0,))) as rows:
                for row in rows:
                    if row["serial"] == "s041":
                        break
                # another statement between the rows: the search's cursor is its own
                assert txn.one("SELECT count(*) AS n FROM devices")["n"] == 100
                assert next(rows)["serial"] == "s042"
            txn.run("UPDATE devices SET state = ? WHERE serial = ?", ("leased", "s041"))
            assert [r["serial"] for r in txn.rows("SELECT serial FROM devices WHERE state = ?",
                                                  ("leased",))] == ["s041"]
    finally:
        store.close()


def test_a_write_transactions_clock_is_read_after_its_lock(pool_url):
    first, second = open_store(pool_url), open_store(pool_url)
    holding, released_at, seen = threading.Event(), [], []

    def hold():
        with first.write() as txn:
            assert txn.now > 0
            holding.set()
            time.sleep(0.5)
            released_at.append(time.time())  # just before its commit

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        with second.write() as txn:  # waits for the lock about 0.5 s
            txn.one("SELECT 1 AS one")  # a result waited for: the clock's comes with it
            seen.append(txn.now)
    finally:
        holder.join()
        first.close()
        second.close()
    # The server's clock and this host's are the same clock here; 50 ms of slack for rounding.
    assert seen[0] >= released_at[0] - 0.05, (seen[0], released_at[0])
