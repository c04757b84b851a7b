"""Leasing, expiry, tokens, constraints, queue order and health, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest

from farm.config import PoolConfig
from farm.errors import LeaseError, LeaseTimeout, PoolError, UsageError
from farm.pool import (
    AVAILABLE,
    LEASED,
    OFFLINE,
    QUARANTINED,
    Holder,
    LeaseRequest,
    Pool,
    parse_priority,
)
from farm.pool.rows import log_event, set_state
from farm.procs import wait_until
from farm.vocab import EventKind
from tests.support.pool import PROMPT_S, BeatClock, HandClock, fake_device


def states(pool: Pool) -> dict[str, str]:
    return {d.device.serial: d.device.state for d in pool.status().devices}


def test_acquire_release_roundtrip(pool):
    pool.sync([fake_device("dev0")])
    holder = Holder(user="ci", host="runner1", pid=42, ci_job="job-7", purpose="pr gate")
    lease = pool.acquire(LeaseRequest(), holder, ttl_s=30, timeout_s=1)
    assert lease.serial == "dev0" and lease.server == "127.0.0.1:15037"
    status = pool.status()
    assert status.devices[0].device.state == LEASED
    assert status.devices[0].lease.token == lease.token
    assert status.devices[0].lease.holder == holder
    pool.release(lease.token)
    assert states(pool) == {"dev0": AVAILABLE}
    kinds = [e.kind for e in pool.history(serial="dev0")]
    assert kinds == ["added", "leased", "released"]


def test_release_with_wrong_or_stale_token_fails_clearly(pool):
    pool.sync([fake_device("dev0")])
    lease = pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=1)
    with pytest.raises(LeaseError, match="unknown to this pool"):
        pool.release("0" * 32)
    assert states(pool) == {"dev0": LEASED}  # a foreign token changes nothing
    pool.release(lease.token)
    other = pool.acquire(LeaseRequest(), Holder("bob", "h2", 7), ttl_s=30, timeout_s=1)
    with pytest.raises(LeaseError) as err:
        pool.release(lease.token)
    assert "was released" in str(err.value) and "now held by bob@h2 pid 7" in str(err.value)
    with pytest.raises(LeaseError):
        pool.renew(lease.token, 30)
    pool.release(other.token)


def test_expired_lease_is_reclaimed_by_next_request(pool):
    pool.sync([fake_device("dev0")])
    pool.clock = clock = HandClock(pool=pool)
    first = pool.acquire(LeaseRequest(), Holder("a", "h", 1), ttl_s=30, timeout_s=1)
    clock.t += 31  # no heartbeat: the lease runs out
    second = pool.acquire(LeaseRequest(), Holder("b", "h", 2), ttl_s=30, timeout_s=5)
    assert second.serial == "dev0" and second.token != first.token
    with pytest.raises(LeaseError, match="expired"):
        first.renew()
    kinds = [(e.kind, e.token) for e in pool.history(serial="dev0")]
    assert kinds[-2:] == [("expired", first.token), ("leased", second.token)]


def test_renew_extends_the_lease(pool):
    pool.sync([fake_device("dev0")])
    pool.clock = clock = HandClock(pool=pool)
    lease = pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=1)
    before = lease.info.expires
    lease.ttl_s = 60
    lease.renew()
    assert lease.info.expires == pytest.approx(lease.info.renewed + 60, abs=1e-6)
    assert lease.info.expires > before + 29
    clock.t += 45  # past the first TTL: the renewal must have kept it
    with pytest.raises(LeaseTimeout):
        pool.acquire(LeaseRequest(), ttl_s=1, timeout_s=0)
    lease.release()


def test_context_manager_releases_and_heartbeats(pool):
    pool.sync([fake_device("dev0")])
    # 70 s on both clocks, holder's and pool's, with a TTL of 30: only the heartbeat keeps the lease.
    pool.clock = BeatClock(pool=pool, beats=7)
    with pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=1, heartbeat_s=10) as lease:
        first = lease.info
        assert wait_until(lambda: lease.info.renewed - first.renewed >= 70.0, timeout=PROMPT_S), \
            "the heartbeat did not renew the lease at every beat"
        assert lease.lost is None
        held = pool.status().devices[0]
        assert held.device.state == LEASED and held.lease.token == lease.token
        assert held.lease.renewed == lease.info.renewed and held.lease.expires > first.expires + 69
        with pytest.raises(LeaseTimeout):  # not expired, so not reclaimed by another request
            pool.acquire(LeaseRequest(), ttl_s=1, timeout_s=0)
    assert states(pool) == {"dev0": AVAILABLE}
    ends = [e.kind for e in pool.history() if e.kind in ("released", "expired")]
    assert ends == ["released"]


def test_a_grant_records_who_holds_the_device_what_they_asked_for_and_until_when(pool):
    # What `farm pool status` and `farm pool history` show an operator chasing a device: the lease
    # row and its "leased" event carry the holder, the request as asked, and the pool's clock.
    pool.sync([fake_device("dev0")])
    holder = Holder("alice", "ci-7", 4242, ci_job="gh-123", purpose="pr-gate")
    request = LeaseRequest(socs=["SM8650"], priority=5, tags=())
    lease = pool.acquire(request, holder, ttl_s=30, timeout_s=0)
    (held,) = pool.status().devices
    assert held.device.state == LEASED and held.lease == lease.info
    # Served at once, the lease and device are returned as the grant wrote them, not read back:
    # they must be what a read back gives.
    assert held.device == lease.device
    info = lease.info
    assert (info.token, info.serial, info.holder, info.priority) == (lease.token, "dev0", holder, 5)
    assert info.created == info.renewed and info.expires == pytest.approx(info.created + 30, abs=1e-6)
    assert (info.ended, info.end_reason) == (None, None)
    (event,) = [e for e in pool.history() if e.kind == "leased"]
    assert (event.serial, event.from_state, event.to_state, event.token) == \
        ("dev0", AVAILABLE, LEASED, lease.token)
    assert event.holder == "alice@ci-7 pid 4242 job gh-123 (pr-gate)"
    assert LeaseRequest.from_json(event.detail) == request
    with pool.store.read() as txn:
        row = txn.one("SELECT request, queue_id FROM leases WHERE token = ?", (lease.token,))
    assert row is not None and LeaseRequest.from_json(row["request"]) == request
    assert row["queue_id"] is not None and row["queue_id"] == event.queue_id
    assert pool.status().queue == []  # the request that was served is no longer waiting


def test_a_state_change_from_a_state_the_device_is_not_in_is_refused_whole(pool):
    # Writes are serialized, so this is a bug of ours if it ever happens: a leased device must not be
    # made available under its holder because some path believed it was in another state.
    pool.sync([fake_device("dev0")])
    lease = pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0)
    before = pool.history(limit=None)
    with pytest.raises(PoolError, match="device dev0: cannot go from available to offline: "
                                        "it is leased; nothing was changed"):
        with pool.store.write() as txn:
            log_event(txn, EventKind.OFFLINE, serial="dev0", detail="a step that must not land")
            set_state(txn, "dev0", AVAILABLE, OFFLINE, reason="stale")
    assert states(pool) == {"dev0": LEASED}
    assert pool.history(limit=None) == before  # the transaction went with it, its event too
    with pytest.raises(PoolError, match="device ghost: .* it is not in the pool"):
        with pool.store.write() as txn:
            set_state(txn, "ghost", AVAILABLE, OFFLINE)
    lease.release()
    assert states(pool) == {"dev0": AVAILABLE}


def test_constraints_select_the_right_device(pool):
    pool.sync([
        fake_device("s24", "SM8650", "v75", virtual=False, tags=("usb3",)),
        fake_device("s23", "SM8550", "v73", virtual=False),
        fake_device("v8650", "SM8650", "v75", virtual=True),
        fake_device("s25", "SM8750", "v79", virtual=False),
    ])

    def pick(**kw) -> str:
        lease = pool.acquire(LeaseRequest(**kw), ttl_s=30, timeout_s=0)
        pool.release(lease.token)
        return lease.serial

    assert pick(socs=["sm8550"]) == "s23"
    assert pick(socs=["SM8650"], virtual=False) == "s24"
    assert pick(socs=["SM8650"], virtual=True) == "v8650"
    assert pick(tags=["usb3"]) == "s24"
    assert pick(serial="s25") == "s25"
    assert pick(min_htp_arch="v79") == "s25"
    assert {pick(min_htp_arch=75, virtual=False) for _ in range(3)} == {"s24", "s25"}
    with pytest.raises(UsageError) as err:  # no device could ever match: refused at once
        pool.acquire(LeaseRequest(socs=["SM8850"]), ttl_s=30, timeout_s=0)
    message = str(err.value)
    assert "SoC SM8850" in message and "no device in the pool could ever serve" in message
    assert "SM8550 (1)" in message and "HTP v73, v75, v79" in message


def test_an_arch_floor_is_matched_on_every_spelling_a_probe_stored(pool):
    # A new waiter's candidates are narrowed in SQL to the stored arch spellings at or above its
    # floor; the spellings are the probes' ("75", "V79"), so a narrowing that assumed "v75" would
    # leave these devices out and the waiter would wait with its devices free.
    pool.sync([
        fake_device("plain", "SM8650", "75", virtual=False),
        fake_device("upper", "SM8750", "V79", virtual=True),
        fake_device("old", "SM8550", "v73", virtual=False),
        fake_device("unknown", "SM8550", None, virtual=False),
    ])
    first = pool.acquire(LeaseRequest(min_htp_arch="v75"), ttl_s=30, timeout_s=0)
    second = pool.acquire(LeaseRequest(min_htp_arch=75), ttl_s=30, timeout_s=0)
    leases = {first.serial: first, second.serial: second}
    assert set(leases) == {"plain", "upper"}
    # Both taken: a floor never falls back to a lower or unknown arch; it waits for one.
    with pytest.raises(LeaseTimeout):
        pool.acquire(LeaseRequest(min_htp_arch="v75"), ttl_s=30, timeout_s=0)
    pool.release(leases["upper"].token)
    # "plain", the physical one at the floor, is held: the free v73 physical device is not it.
    with pytest.raises(LeaseTimeout):
        pool.acquire(LeaseRequest(min_htp_arch=75, virtual=False), ttl_s=30, timeout_s=0)
    assert pool.acquire(LeaseRequest(min_htp_arch=79, virtual=True), ttl_s=30, timeout_s=0).serial == "upper"


def test_timeout_message_names_holder_and_state(pool):
    pool.sync([fake_device("dev0"), fake_device("dev1")])
    lease = pool.acquire(LeaseRequest(serial="dev0"), Holder("alice", "ci-7", 99, "job-5", "nightly"),
                         ttl_s=30, timeout_s=0)
    pool.quarantine("dev1", "usb resets")
    with pytest.raises(LeaseTimeout) as err:
        pool.acquire(LeaseRequest(socs=["SM8650"]), ttl_s=30, timeout_s=0.1)
    message = str(err.value)
    assert "SoC SM8650" in message and "2 of 2 devices match" in message
    assert "dev0 leased, held by alice@ci-7 pid 99 job job-5 (nightly)" in message
    assert "dev1 quarantined (usb resets)" in message
    pool.release(lease.token)
    assert pool.status().queue == []  # the timed-out waiter left the queue


def test_quarantined_device_is_never_leased_until_restored(pool):
    pool.sync([fake_device("dev0")])
    pool.quarantine("dev0", "flaky usb hub")
    assert states(pool) == {"dev0": QUARANTINED}
    with pytest.raises(LeaseTimeout, match="quarantined"):
        pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0.2)
    assert pool.restore("dev0") == AVAILABLE
    lease = pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0)
    assert lease.serial == "dev0"
    pool.release(lease.token)


def test_quarantine_during_lease_outlives_it(pool):
    pool.sync([fake_device("dev0")])
    lease = pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0)
    pool.quarantine("dev0", "thermal shutdown")
    pool.release(lease.token)  # the holder keeps its lease and can release it
    assert states(pool) == {"dev0": QUARANTINED}
    with pytest.raises(LeaseTimeout):
        pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0)


def test_consecutive_infra_failures_quarantine(pool_url):
    with Pool.open(pool_url, PoolConfig(quarantine_after=3), failure_window_s=0) as pool:
        pool.sync([fake_device("dev0")])
        assert not pool.record_infra_failure("dev0", "adb: device offline")
        assert not pool.record_infra_failure("dev0", "push timed out")
        pool.record_success("dev0")  # resets the run
        assert not pool.record_infra_failure("dev0", "push timed out")
        assert not pool.record_infra_failure("dev0", "push timed out")
        assert pool.record_infra_failure("dev0", "shell: connection reset")
        dev = pool.status().devices[0].device
        assert dev.state == QUARANTINED and dev.infra_failures == 3
        assert "3 consecutive infra failures" in dev.reason and "connection reset" in dev.reason
        pool.restore("dev0")
        dev = pool.status().devices[0].device
        assert dev.state == AVAILABLE and dev.infra_failures == 0 and dev.reason == ""
        with pytest.raises(UsageError, match="nosuch"):
            pool.record_infra_failure("nosuch", "x")


def test_sync_marks_vanished_offline_and_returns_them(pool):
    a, b = "127.0.0.1:15037", "10.0.0.2:15037"
    report = pool.sync([fake_device("dev0", server=a), fake_device("dev1", server=a),
                        fake_device("far0", server=b)], servers=[a, b])
    assert sorted(report.added) == ["dev0", "dev1", "far0"]
    lease = pool.acquire(LeaseRequest(serial="dev1"), ttl_s=30, timeout_s=0)
    # Only server a was scanned: far0 (server b) is not touched; dev0 and dev1 are gone.
    report = pool.sync([], servers=[a])
    assert sorted(report.vanished) == ["dev0", "dev1"]
    assert states(pool) == {"dev0": OFFLINE, "dev1": OFFLINE, "far0": AVAILABLE}
    with pytest.raises(LeaseTimeout, match="offline"):
        pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30, timeout_s=0)
    report = pool.sync([fake_device("dev0", server=a), fake_device("dev1", server=a)], servers=[a])
    assert sorted(report.returned) == ["dev0", "dev1"]
    assert states(pool) == {"dev0": AVAILABLE, "dev1": LEASED, "far0": AVAILABLE}
    pool.release(lease.token)
    # A device adb lists but cannot use is offline with the reason.
    pool.sync([fake_device("dev0", server=a, state="unauthorized"), fake_device("dev1", server=a)],
              servers=[a])
    dev0 = next(d.device for d in pool.status().devices if d.device.serial == "dev0")
    assert dev0.state == OFFLINE and "unauthorized" in dev0.reason


def test_sync_rejects_bad_records(pool):
    with pytest.raises(UsageError, match="serial"):
        pool.sync([fake_device("", server="h:1")])
    with pytest.raises(UsageError, match="server"):
        pool.sync([fake_device("x", server="")])
    with pytest.raises(UsageError, match="tags"):
        pool.sync([fake_device("x", tags="usb3")])
    with pytest.raises(UsageError, match="two adb servers"):
        pool.sync([fake_device("x", server="h:1"), fake_device("x", server="h:2")])
    with pytest.raises(UsageError, match="htp_arch"):
        pool.sync([fake_device("x", htp_arch="hexagon")])
    assert pool.status().devices == []  # nothing half-written


def test_waiters_served_in_priority_then_arrival_order(pool_url):
    """One device, five waiters queued one after the other; each release goes to the head."""
    with Pool.open(pool_url, poll_s=0.02) as pool:
        pool.sync([fake_device("dev0")])
        held = pool.acquire(LeaseRequest(), ttl_s=60, timeout_s=0)
        served: list[str] = []
        errors: list[BaseException] = []
        plan = [("A", "pr"), ("B", "nightly"), ("C", "pr"), ("D", "release"), ("E", "nightly")]

        def wait(name: str, priority: str) -> None:
            try:
                with Pool.open(pool_url, poll_s=0.02) as own:
                    lease = own.acquire(LeaseRequest(priority=priority), Holder(name, "h", 1),
                                        ttl_s=60, timeout_s=60)
                    served.append(name)
                    own.release(lease.token)
            except Exception as e:  # noqa: BLE001 - surfaced below
                errors.append(e)

        threads = []
        for i, (name, priority) in enumerate(plan):
            t = threading.Thread(target=wait, args=(name, priority))
            t.start()
            threads.append(t)
            assert wait_until(lambda: len(pool.status().queue) > i or errors, timeout=60), \
                f"waiter {name} not in the queue after 60 s"
        queue = pool.status().queue
        assert [q.holder.user for q in queue] == ["D", "B", "E", "A", "C"]
        pool.release(held.token)
        for t in threads:
            t.join(60)
        assert not errors
        assert served == ["D", "B", "E", "A", "C"]


def test_head_of_queue_only_blocks_devices_it_can_use(pool_url):
    """A high-priority waiter for SM8650 must not keep a freed SM8550 from a low-priority waiter."""
    with Pool.open(pool_url, poll_s=0.02) as pool:
        pool.sync([fake_device("a8650", "SM8650"), fake_device("b8550", "SM8550", "v73")])
        hold_a = pool.acquire(LeaseRequest(serial="a8650"), ttl_s=60, timeout_s=0)
        hold_b = pool.acquire(LeaseRequest(serial="b8550"), ttl_s=60, timeout_s=0)
        got: dict[str, str] = {}

        def wait(name: str, request: LeaseRequest) -> None:
            with Pool.open(pool_url, poll_s=0.02) as own:
                got[name] = own.acquire(request, Holder(name, "h", 1), ttl_s=60, timeout_s=60).serial

        high = threading.Thread(target=wait, args=("high", LeaseRequest(socs=["SM8650"],
                                                                         priority="release")))
        high.start()
        assert wait_until(lambda: len(pool.status().queue) == 1, timeout=60), \
            "the high-priority waiter is not in the queue after 60 s"
        low = threading.Thread(target=wait, args=("low", LeaseRequest(priority="pr")))
        low.start()
        assert wait_until(lambda: len(pool.status().queue) == 2, timeout=60), \
            "the low-priority waiter is not in the queue after 60 s"
        pool.release(hold_b.token)
        low.join(60)
        assert got == {"low": "b8550"}
        pool.release(hold_a.token)
        high.join(60)
        assert got == {"low": "b8550", "high": "a8650"}


def test_request_normalization_and_priorities():
    r = LeaseRequest(socs=["sm8650", "SM8650 "], min_htp_arch="V75", tags=["b", "a", "b"],
                     priority="release")
    assert r.socs == ("SM8650",) and r.min_htp_arch == 75 and r.tags == ("a", "b")
    assert r.priority == 100 and LeaseRequest.from_json(r.to_json()) == r
    assert parse_priority("17") == 17
    with pytest.raises(UsageError, match="priority 'urgent'"):
        parse_priority("urgent")
    with pytest.raises(UsageError, match="min_htp_arch"):
        LeaseRequest(min_htp_arch="hexagon")


def test_a_request_for_one_device_that_times_out_says_which(pool):
    pool.sync([fake_device("dev0"), fake_device("dev1")])
    busy = pool.acquire(LeaseRequest(serial="dev1"), Holder.current("someone"), ttl_s=30, timeout_s=1)
    with pytest.raises(LeaseTimeout) as caught:
        pool.acquire(LeaseRequest(serial="dev1"), Holder.current("me"), ttl_s=30, timeout_s=0.2)
    assert caught.value.serial == "dev1"  # the error is about that device (blame, retries use it)
    busy.release()


def test_a_waiter_is_told_how_long_it_has_waited(pool):
    pool.sync([fake_device("dev0")])
    busy = pool.acquire(LeaseRequest(), Holder.current("someone"), ttl_s=30, timeout_s=1)
    waited: list[float] = []
    with pytest.raises(LeaseTimeout):
        pool.acquire(LeaseRequest(), Holder.current("me"), ttl_s=30, timeout_s=0.6, on_wait=waited.append)
    assert waited and all(isinstance(w, float) for w in waited)
    assert waited == sorted(waited) and 0 <= waited[0] and waited[-1] <= 0.6 + PROMPT_S
    busy.release()


def test_a_lease_granted_after_a_wait_keeps_the_heartbeat_asked_for(pool):
    pool.sync([fake_device("dev0")])
    busy = pool.acquire(LeaseRequest(), Holder.current("someone"), ttl_s=30, timeout_s=1)
    timer = threading.Timer(0.3, busy.release)
    timer.start()
    try:
        lease = pool.acquire(LeaseRequest(), Holder.current("me"), ttl_s=30, timeout_s=PROMPT_S + 1,
                             heartbeat_s=0.123)
    finally:
        timer.join()
    assert lease.heartbeat_s == 0.123
    lease.release()


def test_a_waiter_gives_up_when_its_timeout_passes(pool):
    pool.sync([fake_device("dev0")])
    busy = pool.acquire(LeaseRequest(), Holder.current("someone"), ttl_s=30, timeout_s=1)
    started = time.monotonic()
    with pytest.raises(LeaseTimeout):
        pool.acquire(LeaseRequest(), Holder.current("me"), ttl_s=30, timeout_s=0.3)
    assert time.monotonic() - started < 0.3 + PROMPT_S  # not at its next scheduled write
    busy.release()


def test_a_waiter_that_waits_past_the_stale_bound_keeps_its_place(pool_url):
    """A live waiter refreshes its queue entry well within ``waiter_stale_s``: however long it waits,
    it is never dropped as abandoned (which would put it at the back of the queue)."""
    # 4 s: above a wait's longest sleep between polls (1.5 x the 1 s of a pushing listener)
    with Pool.open(pool_url, waiter_stale_s=4.0, poll_s=0.02) as pool:
        pool.sync([fake_device("dev0")])
        busy = pool.acquire(LeaseRequest(), Holder.current("someone"), ttl_s=30, timeout_s=1)
        timer = threading.Timer(6.0, busy.release)
        timer.start()
        try:
            lease = pool.acquire(LeaseRequest(), Holder.current("me"), ttl_s=30, timeout_s=6 + PROMPT_S)
        finally:
            timer.join()
        kinds = [e.kind for e in pool.history(limit=None)]
        assert "abandoned" not in kinds and kinds.count("queued") == 1, kinds
        lease.release()


def test_a_rung_of_the_recovery_ladder_is_in_the_devices_history(pool):
    pool.sync([fake_device("dev0")])
    pool.record_recovery("dev0", "rung reboot: ok after 2.0s (answering, booted)")
    [event] = [e for e in pool.history("dev0", limit=None) if e.kind == "recovery"]
    assert event.serial == "dev0" and event.detail == "rung reboot: ok after 2.0s (answering, booted)"
    with pytest.raises(UsageError, match="device ghost: not in the pool"):
        pool.record_recovery("ghost", "rung return: no")
