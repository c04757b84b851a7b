"""The leasing rules users read and rely on (farm.pool.leases): what a refusal and a timeout say,
renew and release and their refusals, the lease's clock, spreading load, dropping a waiter that stopped
polling, and reading the event log. Fast: one process, no device."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest

from farm.config import FarmConfig, PoolConfig
from farm.db.base import Listener, PoolLost
from farm.errors import LeaseError, LeaseLost, LeaseTimeout, PoolError, UsageError
from farm.pool import AVAILABLE, LEASED, QUARANTINED, Holder, LeaseRequest, Pool
from farm.pool.leases import fence_margin
from farm.pool.rows import log_event
from farm.procs import wait_until
from farm.vocab import EventKind
from tests.support.pool import PROMPT_S, HandClock, fake_device

ALICE = Holder("alice", "ci-7", 99, "job-5", "nightly")
LAB = [fake_device("a8650", "SM8650", "v75", tags=("usb3",)),
       fake_device("b8550", "SM8550", "v73", virtual=False),
       fake_device("c8550", "SM8550", "v73", virtual=False, tags=("usb3", "fast"))]
LAB_INVENTORY = ("3 device(s): SoC SM8550 (2), SM8650 (1); HTP v73, v75; tags fast (1), usb3 (2); "
                 "1 virtual, 2 physical")


@pytest.fixture
def lab(pool: Pool) -> Pool:
    pool.sync(LAB)
    return pool


@pytest.mark.parametrize(("request_", "why"), [
    (LeaseRequest(socs=("SM8560",)),
     "unknown SoC 'SM8560' (did you mean SM8850 or SM8750 or SM8650?)"),
    (LeaseRequest(socs=("QCS404X",)), "unknown SoC 'QCS404X'"),
    (LeaseRequest(socs=("SM8750", "SM8850")), "no device of SoC SM8750|SM8850"),
    (LeaseRequest(socs=("SM8750",), tags=("nope",)), "no device of SoC SM8750; unknown tag(s) nope"),
    (LeaseRequest(min_htp_arch=75, tags=("nope",)), "unknown tag(s) nope"),  # v75 exists: not a reason
    (LeaseRequest(tags=("nope", "fast", "gone")), "unknown tag(s) gone, nope"),
    (LeaseRequest(min_htp_arch=79), "HTP >= v79 is above every device (highest: v75)"),
    (LeaseRequest(serial="zz"), "no device zz"),
    (LeaseRequest(socs=("SM8650",), virtual=False), "no single device has all of it"),
    (LeaseRequest(socs=("SM8550",), tags=("fast",), virtual=True), "no single device has all of it"),
])
def test_a_request_no_device_could_ever_serve_is_refused_with_why_and_the_inventory(lab, request_, why):
    with pytest.raises(UsageError) as refused:
        lab.acquire(request_, ttl_s=30, timeout_s=5)
    assert str(refused.value) == (f"no device in the pool could ever serve [{request_.describe()}]: "
                                  f"{why}. The pool has {LAB_INVENTORY}")
    assert lab.status().queue == []  # refused at once, never queued


def test_a_refusal_counts_offline_devices_of_unknown_soc_and_names_the_missing_kind(pool):
    pool.sync([fake_device("p0", "SM8650", "v75", virtual=False),
               fake_device("p1", None, None, virtual=False, server="127.0.0.1:15038"),
               fake_device("p2", None, None, virtual=False)])
    pool.sync([fake_device("p0", "SM8650", "v75", virtual=False), fake_device("p2", None, None, virtual=False)],
              ["127.0.0.1:15037", "127.0.0.1:15038"])  # p1 went
    with pytest.raises(UsageError) as refused:
        pool.acquire(LeaseRequest(virtual=True), ttl_s=30, timeout_s=5)
    assert str(refused.value) == (
        "no device in the pool could ever serve [virtual (priority 0)]: no virtual device. The pool has "
        "3 device(s): SoC SM8650 (1), unknown (2); HTP v75; tags none; 0 virtual, 3 physical; 1 offline")


def test_a_request_for_a_physical_device_in_a_virtual_pool_is_refused(pool):
    pool.sync([fake_device("v0", "SM8650", "v75")])
    with pytest.raises(UsageError, match=r"\]: no physical device\. The pool has "):
        pool.acquire(LeaseRequest(virtual=False), ttl_s=30, timeout_s=5)


def test_an_empty_pool_is_waited_on_and_its_timeout_says_it_is_empty(pool):
    with pytest.raises(LeaseTimeout) as timeout:
        pool.acquire(LeaseRequest(socs=("SM8650",)), ttl_s=30, timeout_s=0)
    assert str(timeout.value) == ("no device for request [SoC SM8650 (priority 0)] within 0s: "
                                  "no device in the pool matches; the pool has 0: none")


def test_a_timeout_names_each_matching_device_its_state_and_holder(lab):
    held = lab.acquire(LeaseRequest(serial="c8550"), ALICE, ttl_s=30, timeout_s=0)
    lab.quarantine("b8550", "usb resets")
    with pytest.raises(LeaseTimeout) as timeout:
        lab.acquire(LeaseRequest(socs=("SM8550",)), ttl_s=30, timeout_s=0)
    assert str(timeout.value) == (
        "no device for request [SoC SM8550 (priority 0)] within 0s: 2 of 3 devices match: "
        "b8550 quarantined (usb resets); c8550 leased, held by alice@ci-7 pid 99 job job-5 (nightly) "
        "for 0s, expires in 30s")
    held.release()


@pytest.mark.parametrize(("count", "more"), [(12, ""), (14, " and 2 more")])
def test_a_timeout_when_no_device_matches_lists_the_pool(pool, count, more):
    pool.sync([fake_device(f"d{i:02}") for i in range(count)])
    with pytest.raises(LeaseTimeout) as timeout:  # could match some day: waits, then times out
        pool.acquire(LeaseRequest(exclude=tuple(f"d{i:02}" for i in range(count))), ttl_s=30, timeout_s=0)
    listed = "; ".join(f"d{i:02} (SM8650, HTP v75, virtual) on 127.0.0.1:15037" for i in range(12))
    assert str(timeout.value).endswith(
        f"within 0s: no device in the pool matches; the pool has {count}: {listed}{more}")


def test_a_timeout_counts_the_waiters_ahead(lab):
    held = [lab.acquire(LeaseRequest(serial=s), ttl_s=30, timeout_s=0) for s in ("b8550", "c8550")]
    first = threading.Thread(target=lambda: lab.acquire(LeaseRequest(socs=("SM8550",), priority=5),
                                                        ttl_s=30, timeout_s=PROMPT_S).release())
    first.start()
    try:
        assert wait_until(lambda: len(lab.status().queue) == 1, timeout=PROMPT_S)
        with pytest.raises(LeaseTimeout) as timeout:
            lab.acquire(LeaseRequest(socs=("SM8550",)), ttl_s=30, timeout_s=0)
        assert str(timeout.value).endswith("expires in 30s; 1 waiter(s) ahead of this request")
        with pytest.raises(LeaseTimeout) as timeout:  # a higher priority is served before it
            lab.acquire(LeaseRequest(socs=("SM8550",), priority=9), ttl_s=30, timeout_s=0)
        assert "ahead" not in str(timeout.value)
    finally:
        for lease in held:
            lease.release()
        first.join()


def test_a_lease_lasts_its_ttl_from_its_last_renewal(lab):
    lease = lab.acquire(LeaseRequest(serial="a8650"), ALICE, ttl_s=45, timeout_s=0)
    assert (lease.info.expires - lease.info.created, lease.ttl_s) == (45, 45)
    renewed = lab.renew(lease.token, 120)
    assert renewed.token == lease.token and renewed.expires - renewed.renewed == 120
    assert renewed.renewed >= lease.info.renewed and renewed.ended is None
    assert lab.status().devices[0].lease.expires == renewed.expires


def test_the_pools_default_ttl_applies_when_none_is_given(tmp_path):
    with Pool.open(f"sqlite:///{tmp_path / 'pool.db'}", PoolConfig(lease_ttl_s=77)) as pool:
        pool.sync([fake_device("dev0")])
        lease = pool.acquire(LeaseRequest(), timeout_s=0)
        assert lease.ttl_s == 77 and lease.info.expires - lease.info.created == 77


@pytest.mark.parametrize("ttl", [0, -5])
def test_a_ttl_that_is_not_positive_is_refused(lab, ttl):
    with pytest.raises(ValueError, match=f"^ttl_s must be positive, got {ttl}$"):
        lab.acquire(LeaseRequest(), ttl_s=ttl, timeout_s=0)


def test_release_ends_the_lease_and_frees_the_device(lab):
    lease = lab.acquire(LeaseRequest(serial="a8650"), ALICE, ttl_s=30, timeout_s=0)
    ended = lab.release(lease.token)
    assert ended.token == lease.token and ended.ended is not None and ended.end_reason == "released"
    assert ended.holder == ALICE
    by_serial = {d.device.serial: d for d in lab.status().devices}
    assert by_serial["a8650"].device.state == AVAILABLE and by_serial["a8650"].lease is None


def test_an_ended_lease_is_neither_renewed_nor_released_and_the_refusal_says_why(lab):
    lease = lab.acquire(LeaseRequest(serial="a8650"), ttl_s=30, timeout_s=0)
    lab.release(lease.token)
    for verb, act in (("renew", lambda: lab.renew(lease.token, 30)),
                      ("release", lambda: lab.release(lease.token))):
        with pytest.raises(LeaseError) as refused:
            act()
        assert str(refused.value).startswith(f"cannot {verb}: lease {lease.token} on a8650 was released ")
    with pytest.raises(LeaseError, match=r"^cannot renew: lease token '0+' is unknown to this pool"):
        lab.renew("0" * 32, 30)
    assert {d.device.serial: d.device.state for d in lab.status().devices}["a8650"] == AVAILABLE


def test_successive_leases_spread_over_equivalent_devices(pool):
    pool.sync([fake_device("dev0"), fake_device("dev1"), fake_device("dev2")])
    served = []
    for _ in range(6):
        lease = pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0)
        served.append(lease.serial)
        lease.release()
    assert served == ["dev0", "dev1", "dev2", "dev0", "dev1", "dev2"]


def test_all_free_devices_go_to_the_waiters_that_fit_them(pool):
    pool.sync([fake_device("x0", "SM8650"), fake_device("y0", "SM8550", "v73")])
    held = [pool.acquire(LeaseRequest(serial=s), ttl_s=30, timeout_s=0) for s in ("x0", "y0")]
    got: dict[str, str] = {}
    waiters = [threading.Thread(target=lambda soc=soc: got.__setitem__(
        soc, pool.acquire(LeaseRequest(socs=(soc,)), ttl_s=30, timeout_s=PROMPT_S).serial))
        for soc in ("SM8650", "SM8550")]
    for w in waiters:
        w.start()
    assert wait_until(lambda: len(pool.status().queue) == 2, timeout=PROMPT_S)
    for lease in held:  # both freed in turn: each goes to the one waiter that can use it
        lease.release()
    for w in waiters:
        w.join()
    assert got == {"SM8650": "x0", "SM8550": "y0"}
    assert pool.status().queue == []


def test_a_waiter_that_stops_polling_is_dropped_and_queues_again_at_the_back(pool_url):
    with Pool.open(pool_url, poll_s=0.02, waiter_stale_s=0.4) as pool, \
            Pool.open(pool_url, poll_s=0.02) as other:
        pool.sync([fake_device("dev0")])
        held = pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0)
        stalled, resume = threading.Event(), threading.Event()

        def on_wait(_waited: float) -> None:
            if not resume.is_set():
                stalled.set()
                resume.wait(PROMPT_S)  # a waiter that stopped polling (paused, swapped out)

        result: list[str] = []
        waiter = threading.Thread(target=lambda: result.append(
            other.acquire(LeaseRequest(), Holder("bob", "h2", 7), ttl_s=30, timeout_s=PROMPT_S,
                          on_wait=on_wait).serial))
        waiter.start()
        assert stalled.wait(PROMPT_S)
        # Any pool change settles the pool: a waiter silent for longer than waiter_stale_s goes.
        assert wait_until(lambda: (pool.record_success("dev0"), pool.status().queue)[1] == [],
                          timeout=PROMPT_S, interval=0.2)
        abandoned = [e for e in pool.history() if e.kind == "abandoned"]
        assert len(abandoned) == 1 and abandoned[0].holder == "bob@h2 pid 7"
        assert abandoned[0].detail.startswith("no poll for ")
        silent = float(abandoned[0].detail.removeprefix("no poll for ").removesuffix("s"))
        assert 0.4 <= silent < PROMPT_S + 30  # how long it was silent, past waiter_stale_s
        queued = [e for e in pool.history() if e.kind == "queued"]
        assert abandoned[0].queue_id is not None and abandoned[0].queue_id == queued[0].queue_id
        resume.set()
        assert wait_until(lambda: len(pool.status().queue) == 1, timeout=PROMPT_S)  # back in the queue
        held.release()
        waiter.join()
        assert result == ["dev0"]


def test_history_filters_by_device_and_lease_and_pages_by_id(lab):
    first = lab.acquire(LeaseRequest(serial="a8650"), ttl_s=30, timeout_s=0)
    second = lab.acquire(LeaseRequest(serial="b8550"), ttl_s=30, timeout_s=0)
    first.release()
    everything = lab.history(limit=None)
    assert [e.id for e in everything] == sorted(e.id for e in everything)  # oldest first
    assert [e.kind for e in lab.history(serial="a8650")] == ["added", "leased", "released"]
    assert [(e.kind, e.serial) for e in lab.history(token=first.token)] == \
        [("leased", "a8650"), ("released", "a8650")]
    assert [e.kind for e in lab.history(serial="a8650", token=second.token)] == []
    assert lab.history(limit=2) == everything[-2:]
    after = everything[-3].id
    assert lab.history(after_id=after) == everything[-2:]
    assert lab.history(serial="b8550", after_id=after) == [e for e in everything[-2:] if e.serial == "b8550"]
    second.release()


def test_status_lists_devices_by_serial_with_their_leases(lab):
    lease = lab.acquire(LeaseRequest(serial="b8550"), ALICE, ttl_s=30, timeout_s=0)
    status = lab.status()
    assert [d.device.serial for d in status.devices] == ["a8650", "b8550", "c8550"]
    assert [(d.device.state, d.lease.token if d.lease else None) for d in status.devices] == \
        [(AVAILABLE, None), (LEASED, lease.token), (AVAILABLE, None)]
    assert status.devices[1].lease.holder == ALICE and status.queue == []
    lease.release()


def test_leaving_a_lease_that_ended_under_it_raises_unless_already_unwinding(lab, caplog):
    lease = lab.acquire(LeaseRequest(serial="a8650"), ttl_s=30, timeout_s=0)
    with pytest.raises(LeaseError, match="^cannot release: "):
        with lease:
            lab.release(lease.token)  # taken away under the holder
    lease = lab.acquire(LeaseRequest(serial="a8650"), ttl_s=30, timeout_s=0)
    with caplog.at_level(logging.WARNING, logger="farm.pool.leases"), \
            pytest.raises(KeyError, match="the test's own error"):
        with lease:
            lab.release(lease.token)
            raise KeyError("the test's own error")  # not hidden by the failed release
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and re.fullmatch(
        rf"lease {lease.token[:8]} on a8650: not released \(cannot release: .+\) while handling KeyError",
        said[0]), said


# -- a waiter that goes away, a holder that died, a holder's clock that steps back -----------------


class _Interrupted(BaseException):
    """What a Ctrl-C or a pytest timeout raises inside a waiting acquire."""


def test_an_interrupted_waiter_leaves_the_queue_and_gives_back_a_device_granted_meanwhile(pool):
    pool.sync([fake_device("dev0"), fake_device("dev1")])
    first = pool.acquire(LeaseRequest(serial="dev0"), ALICE, ttl_s=30, timeout_s=0)
    bob = Holder("bob", "h2", 7)

    entries: list[int] = []

    def interrupt(_waited: float) -> None:
        entries.extend(q.id for q in pool.status().queue)
        raise _Interrupted

    with pytest.raises(_Interrupted):  # nothing granted: the entry goes, nothing else changes
        pool.acquire(LeaseRequest(serial="dev0"), bob, ttl_s=30, timeout_s=PROMPT_S, on_wait=interrupt)
    assert pool.status().queue == []
    gave_up = [e for e in pool.history() if e.kind == "gave_up"]
    assert [(e.holder, e.detail, e.queue_id) for e in gave_up] == \
        [("bob@h2 pid 7", "acquire interrupted", entries[0])]

    def grant_then_interrupt(_waited: float) -> None:
        first.release()  # dispatch grants dev0 to the waiter in this very write...
        raise _Interrupted  # ...which is interrupted before it reads its grant

    with pytest.raises(_Interrupted):
        pool.acquire(LeaseRequest(serial="dev0"), bob, ttl_s=30, timeout_s=PROMPT_S,
                     on_wait=grant_then_interrupt)
    devices = {d.device.serial: d for d in pool.status().devices}
    assert devices["dev0"].device.state == AVAILABLE and devices["dev0"].lease is None
    granted = [e for e in pool.history(serial="dev0") if e.kind in ("leased", "released")]
    assert [e.kind for e in granted] == ["leased", "released", "leased", "released"]
    assert granted[2].holder == granted[3].holder == "bob@h2 pid 7"
    assert pool.status().queue == []
    assert pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30, timeout_s=0).serial == "dev0"


def test_a_waiter_interrupted_while_the_pool_is_unreachable_keeps_its_own_error(pool, caplog):
    pool.sync([fake_device("dev0")])
    held = pool.acquire(LeaseRequest(serial="dev0"), ALICE, ttl_s=30, timeout_s=0)
    store = pool.store
    entries: list[int] = []

    def pool_goes_then_interrupt(_waited: float) -> None:
        entries.extend(q.id for q in pool.status().queue)
        pool.store = _Unreachable()
        raise _Interrupted

    with caplog.at_level(logging.WARNING, logger="farm.pool.leases"), pytest.raises(_Interrupted):
        pool.acquire(LeaseRequest(serial="dev0"), Holder("bob", "h2", 7), ttl_s=30, timeout_s=PROMPT_S,
                     on_wait=pool_goes_then_interrupt)
    pool.store = store
    assert [r.getMessage() for r in caplog.records] == [
        f"leaving queue entry {entries[0]} after an interrupted acquire failed (connection refused); "
        f"it is dropped as stale later"]
    assert [q.id for q in pool.status().queue] == entries  # left for the stale sweep, as it says
    held.release()


def test_a_dead_holders_leases_and_requests_end_and_no_one_elses(pool):
    pool.sync([fake_device("dev0"), fake_device("dev1"), fake_device("dev2")])
    dead, alive = Holder("ci", "h1", 41), Holder("ci", "h1", 42)
    other_host = Holder("ci", "h2", 41)  # the same pid on another host is another process
    held = [pool.acquire(LeaseRequest(serial=s), dead, ttl_s=30, timeout_s=0) for s in ("dev0", "dev1")]
    kept = pool.acquire(LeaseRequest(serial="dev2"), alive, ttl_s=30, timeout_s=0)
    frozen = threading.Event()  # the dead process's waiting acquire: it never polls again
    in_wait = threading.Event()

    def stopped(_waited: float) -> None:
        in_wait.set()
        frozen.wait(PROMPT_S)
        raise _Interrupted

    outcome: dict[str, object] = {}

    def wait_for_dev2(who: Holder, on_wait) -> None:
        try:
            outcome[who.host] = pool.acquire(LeaseRequest(serial="dev2"), who, ttl_s=30,
                                             timeout_s=PROMPT_S, on_wait=on_wait).serial
        except BaseException as e:  # noqa: BLE001 - recorded and asserted on below
            outcome[who.host] = e

    threads = [threading.Thread(target=wait_for_dev2, args=(dead, stopped))]
    threads[0].start()
    assert in_wait.wait(PROMPT_S) and [q.holder for q in pool.status().queue] == [dead]
    dead_entry = pool.status().queue[0].id
    threads.append(threading.Thread(target=wait_for_dev2, args=(other_host, None)))
    threads[1].start()
    assert wait_until(lambda: len(pool.status().queue) == 2, timeout=PROMPT_S)

    assert sorted(pool.release_holder("h1", 41, "worker gw3 crashed")) == ["dev0", "dev1"]
    devices = {d.device.serial: d for d in pool.status().devices}
    assert devices["dev0"].device.state == devices["dev1"].device.state == AVAILABLE
    assert devices["dev2"].lease is not None and devices["dev2"].lease.token == kept.token
    assert [q.holder for q in pool.status().queue] == [other_host]
    abandoned = [e for e in pool.history() if e.kind == "abandoned"]
    assert [(e.holder, e.detail, e.queue_id) for e in abandoned] == \
        [("ci@h1 pid 41", "holder died: worker gw3 crashed", dead_entry)]
    for lease in held:
        with pytest.raises(LeaseError):
            lease.renew()
    kept.release()  # the other host's waiter is next: the dead one's request is gone
    threads[1].join(PROMPT_S)
    assert outcome["h2"] == "dev2"
    frozen.set()
    threads[0].join(PROMPT_S)
    assert isinstance(outcome["h1"], _Interrupted)
    assert [e.kind for e in pool.history() if e.kind == "gave_up"] == []  # nothing left to leave
    assert pool.release_holder("h9", 1, "nobody") == []


def test_a_clock_that_steps_back_asks_the_pool_at_once(pool):
    pool.sync([fake_device("dev0"), fake_device("dev1")])
    pool.clock = clock = HandClock()
    ttl = 30.0
    live = pool.acquire(LeaseRequest(serial="dev0"), ttl_s=ttl, timeout_s=0)
    clock.t -= 3600  # the VM was restored, or the clock stepped: the old deadline means nothing now
    renewed_before = live.info.renewed
    live.check()  # the pool says it lives: renewed, deadline re-based on the clock as it now reads
    assert live.info.renewed >= renewed_before
    assert live.valid_until == pytest.approx(clock.t + ttl - fence_margin(ttl), abs=1e-3)

    ended = pool.acquire(LeaseRequest(serial="dev1"), ttl_s=ttl, timeout_s=0)
    pool.release(ended.token)  # ended in the pool while the holder's clock says it has 29 s left
    ended.check()  # no step back: the holder cannot know without asking
    clock.t -= 10
    with pytest.raises(LeaseLost, match="dev1"):
        ended.check()
    assert isinstance(ended.lost, LeaseError)

    store, pool.store = pool.store, _Unreachable()
    try:
        clock.t -= 10
        with pytest.raises(LeaseLost, match="could not confirm the lease"):
            live.check()
    finally:
        pool.store = store
    other = pool.acquire(LeaseRequest(serial="dev1"), ttl_s=ttl, timeout_s=0)
    pool.store = _Unreachable(PoolLost("the pool file was replaced: its leases are lost"))
    try:
        clock.t -= 10
        with pytest.raises(LeaseLost) as lost:
            other.check()
        # The pool that granted the lease is gone: said as the pool says it, not as an outage.
        assert str(other.lost) == "the pool file was replaced: its leases are lost"
        assert "could not confirm" not in str(lost.value)
    finally:
        pool.store = store


class _Unreachable:
    """A pool store whose every use fails as a database that went away (or ``error``)."""

    def __init__(self, error: PoolError | None = None) -> None:
        self._error = error or PoolError("connection refused")

    def __getattr__(self, name):
        raise self._error


def test_the_configured_pool_settings_and_failure_window_are_the_pools(tmp_path):
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    config = FarmConfig(home=tmp_path, adb_servers=[],
                        pool=PoolConfig(url=url, quarantine_after=2, lease_ttl_s=77.0))
    with Pool.from_config(config, failure_window_s=3600) as pool:
        assert pool.quarantine_after == 2 and pool.default_ttl_s == 77.0
        pool.sync([fake_device("dev0")])
        assert pool.record_infra_failure("dev0", "adb: closed") is False
        # Within the window: the same incident (a retry straight back to the device), counted once.
        assert pool.record_infra_failure("dev0", "adb: closed") is False
        assert pool.status().devices[0].device.state == AVAILABLE
    with Pool.from_config(config, failure_window_s=0) as pool:
        assert pool.record_infra_failure("dev0", "adb: closed again") is True
        assert pool.status().devices[0].device.state == QUARANTINED


def test_touch_keeps_listed_devices_seen_and_names_those_that_need_a_sync(pool):
    pool.sync([fake_device("dev0"), fake_device("dev1", server="127.0.0.1:25037")])
    pool.sync([fake_device("dev0")], servers=["127.0.0.1:15037", "127.0.0.1:25037"])  # dev1 gone
    before = {d.device.serial: d.device.last_seen for d in pool.status().devices}
    assert pool.touch(["dev0", "dev1", "new9", "dev0"]) == ["dev1", "new9"]
    after = {d.device.serial: d.device.last_seen for d in pool.status().devices}
    assert after["dev0"] >= before["dev0"] and after["dev1"] == before["dev1"]


def test_prune_drops_only_offline_devices_and_refuses_a_bad_age(pool):
    pool.sync([fake_device("dev0"), fake_device("dev1")])
    pool.sync([fake_device("dev0")])  # dev1 went offline just now
    for age in (-1, float("inf"), float("nan")):
        with pytest.raises(UsageError, match="prune: the age must be a finite number >= 0"):
            pool.prune(age)
    assert pool.prune(3600) == []  # offline for less than an hour: kept
    assert wait_until(lambda: pool.prune(0) == ["dev1"], timeout=PROMPT_S, interval=0.05)
    assert [d.device.serial for d in pool.status().devices] == ["dev0"]
    pruned = [e for e in pool.history() if e.kind == "pruned"]
    assert [e.serial for e in pruned] == ["dev1"]


class _Counted:
    """Counts a pool's write transactions and polls (wrapping its own methods)."""

    def __init__(self, pool: Pool) -> None:
        self.writes = self.polls = 0
        write, poll = pool._write, pool._poll

        def counted_write():
            self.writes += 1
            return write()

        def counted_poll(queue_id):
            self.polls += 1
            return poll(queue_id)

        pool._write, pool._poll = counted_write, counted_poll


@pytest.fixture
def waiter_and_holders(pool_url):
    """Two processes' pools on one database: a waiter's, fast to poll and never dropped as stale,
    and the holders' (dev0 in it); the waiter's writes and polls counted."""
    with Pool.open(pool_url, poll_s=0.01, waiter_stale_s=3600) as waiter_pool, \
            Pool.open(pool_url) as holders:
        holders.sync([fake_device("dev0")])
        yield waiter_pool, holders, _Counted(waiter_pool)


def test_a_waiter_takes_the_write_lock_only_when_something_changed_for_it(waiter_and_holders):
    # The pool's write lock is the farm's one point of contention: 500 waiters each writing on every
    # poll would serialize on it. A waiter writes to queue, and otherwise only reads.
    waiter_pool, holders, counted = waiter_and_holders
    held = holders.acquire(LeaseRequest(serial="dev0"), ALICE, ttl_s=30, timeout_s=0)
    waiter_pool._wait = lambda listener, queue_id, deadline: False  # poll at once, never told
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(
        waiter_pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30, timeout_s=PROMPT_S).serial))
    waiter.start()
    assert wait_until(lambda: counted.polls >= 20, timeout=PROMPT_S)
    assert counted.writes == 1  # the write that queued it; its polls changed nothing
    held.release()  # the releasing write grants dev0 to the waiter (dispatch)
    waiter.join(PROMPT_S)
    assert got == ["dev0"]
    assert counted.writes == 1  # it read its grant: no write of its own


def test_a_waiter_reclaims_an_expired_lease_at_its_next_poll(waiter_and_holders):
    waiter_pool, holders, counted = waiter_and_holders
    gone = holders.acquire(LeaseRequest(serial="dev0"), ALICE, ttl_s=0.3, timeout_s=0)
    # Nobody else writes: only the waiter's own poll can notice that the holder stopped renewing.
    began = time.monotonic()
    got = waiter_pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30, timeout_s=20)
    # Not a timing of the host: a waiter that misses the expiry sits until its 20 s timeout.
    assert time.monotonic() - began < 10
    assert got.serial == "dev0" and got.token != gone.token
    # Queued, then the reclaiming write its poll asked for (unless the host was so slow that the
    # lease had expired before the waiter first wrote, and that write reclaimed it).
    assert counted.writes == (2 if counted.polls else 1)
    assert [e.kind for e in waiter_pool.history(token=gone.token)] == ["leased", "expired"]


def test_a_status_is_read_at_the_pools_own_now(pool):
    # `farm pool status` shows ages and expiries against this `now`: it must be the pool's clock,
    # the one the lease times in the same read were written on.
    pool.sync([fake_device("dev0")])
    lease = pool.acquire(LeaseRequest(serial="dev0"), ALICE, ttl_s=30, timeout_s=0)
    status = pool.status()
    held = status.devices[0].lease
    assert held is not None and held.token == lease.token
    assert held.created <= status.now < held.expires
    assert pool.history()[-1].at <= status.now


def test_a_timeout_on_an_empty_pool_says_it_has_none(pool):
    with pytest.raises(LeaseTimeout) as timeout:
        pool.acquire(LeaseRequest(), timeout_s=0)
    assert str(timeout.value) == ("no device for request [any device (priority 0)] within 0s: no device "
                                  "in the pool matches; the pool has 0: none")


def test_a_timeout_names_a_device_unseen_past_the_liveness_bound(pool_url):
    with Pool.open(pool_url, PoolConfig(url=pool_url, liveness_s=0.05)) as pool:
        pool.sync([fake_device("dev0")])
        assert wait_until(lambda: pool.status().now - pool.status().devices[0].device.last_seen > 0.1,
                          timeout=PROMPT_S, interval=0.05)
        with pytest.raises(LeaseTimeout) as timeout:
            pool.acquire(LeaseRequest(), timeout_s=0)
    assert str(timeout.value).startswith(
        "no device for request [any device (priority 0)] within 0s: 1 of 1 devices match: dev0 offline "
        "(not seen for ")
    assert str(timeout.value).endswith(
        "(liveness bound 0.05s; 'farm pool sync' or 'farm pool watch' refreshes it))")


def test_history_is_every_event_from_the_first_and_the_last_n_oldest_first(pool):
    pool.sync([fake_device("dev0"), fake_device("dev1")])
    lease = pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30, timeout_s=0)
    lease.release()
    everything = pool.history(limit=None)
    assert [(e.kind, e.serial) for e in everything] == [
        ("added", "dev0"), ("added", "dev1"), ("leased", "dev0"), ("released", "dev0")]
    assert pool.history() == everything  # fewer than the default limit of 100
    assert pool.history(limit=2) == everything[-2:]
    assert pool.history(limit=2, after_id=everything[0].id) == everything[-2:]
    assert pool.history(limit=None, after_id=everything[1].id) == everything[2:]


class _RecordingListener(Listener):
    """A waiter's listener that records how long each wait was asked to last (the poll interval
    as the waiter chose it), passing the wait on to the real listener (or, alone, only sleeping)."""

    def __init__(self, inner: Listener | None, asked: list[float]) -> None:
        self._inner, self._asked = inner, asked
        self.pushes = inner.pushes if inner is not None else False
        self.queue_id = inner.queue_id if inner is not None else None

    def wait(self, timeout: float) -> set[int]:
        self._asked.append(timeout)
        return self._inner.wait(timeout) if self._inner is not None else super().wait(timeout)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()


@pytest.mark.parametrize("told", [True, False], ids=["grants-pushed", "no-wake-up"])
def test_a_waiter_told_of_its_grant_polls_only_as_a_fallback(waiter_and_holders, told):
    # Told of its grant, a waiter polls about once a second (to notice expiries and lost
    # notifications), so that 500 waiters do not read the pool 20 times a second each; not told,
    # it polls every poll_s, jittered so that waiters do not poll in lock-step.
    waiter_pool, holders, _ = waiter_and_holders
    held = holders.acquire(LeaseRequest(serial="dev0"), ALICE, ttl_s=30, timeout_s=0)
    asked: list[float] = []
    listen = waiter_pool.store.listener
    waiter_pool.store.listener = lambda queue_id=None: _RecordingListener(
        listen(queue_id) if told else None, asked)
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(
        waiter_pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30, timeout_s=PROMPT_S).serial))
    waiter.start()
    try:
        assert wait_until(lambda: len(asked) >= (1 if told else 60), timeout=10)
    finally:
        held.release()
        waiter.join(PROMPT_S)
    assert got == ["dev0"]
    if told:  # PUSHED_POLL_S (1 s) jittered by 0.5-1.5, less what went by before the wait began
        assert 0.3 < asked[0] <= 1.5, asked
    else:  # poll_s (0.01 s) jittered by 0.5-1.5, and the jitter is there
        polls = asked[:60]
        assert all(0 < t <= 0.015 for t in polls), polls
        assert min(polls) < 0.008 and max(polls) > 0.012, polls


def test_a_device_of_unknown_soc_might_have_any_htp_arch_so_it_is_waited_for(pool):
    # adb could not probe it (no SoC, no arch yet): it may be the v79 phone the request wants, so the
    # request waits for it rather than being refused as one no device could ever serve.
    pool.sync([fake_device("p0", None, None, virtual=False)])
    with pytest.raises(LeaseTimeout, match="within 0s"):
        pool.acquire(LeaseRequest(min_htp_arch="v79"), ttl_s=30, timeout_s=0)
    pool.sync([fake_device("p0", "SM8550", "v73", virtual=False)])  # probed now: it is a v73
    with pytest.raises(UsageError, match="could ever serve"):
        pool.acquire(LeaseRequest(min_htp_arch="v79"), ttl_s=30, timeout_s=0)


def test_history_shows_the_last_hundred_events_unless_told(pool):
    pool.sync([fake_device("dev0")])
    with pool.store.write() as txn:
        for i in range(120):
            log_event(txn, EventKind.TAGGED, serial="dev0", detail=f"event {i}")
    recent = pool.history()
    assert len(recent) == 100 and recent[-1].detail == "event 119" and recent[0].detail == "event 20"
    assert len(pool.history(limit=None)) == 121  # with the sync's "added"


class _Told(Listener):
    """A listener that hears the given grants, one set per wait, at once (then nothing, at once)."""

    pushes = True

    def __init__(self, *heard: set[int]) -> None:
        self.heard, self.waits = list(heard), 0

    def wait(self, timeout: float) -> set[int]:
        self.waits += 1
        return self.heard.pop(0) if self.heard else set()


def test_a_waiter_told_of_its_own_grant_stops_waiting_at_once_and_of_anothers_does_not(pool):
    told = _Told({7})
    assert pool._wait(told, 7, deadline=time.monotonic() + PROMPT_S) is True and told.waits == 1
    others = _Told({8}, {9, 10})  # grants to other waiters: ours is still to come
    assert pool._wait(others, 7, deadline=time.monotonic() + 0.05) is False and others.waits > 2
    assert pool._wait(_Told(), 7, deadline=time.monotonic() - 1) is False  # past the deadline


def test_a_request_that_waits_and_gives_up_leaves_its_story_in_the_history(pool):
    # `farm pool history` is how an operator finds out who waited for what and for how long.
    pool.sync([fake_device("dev0")])
    held = pool.acquire(LeaseRequest(serial="dev0"), ALICE, ttl_s=30, timeout_s=0)
    bob = Holder("bob", "h2", 7, ci_job="gh-9")
    request = LeaseRequest(serial="dev0", priority=3)
    with pytest.raises(LeaseTimeout):
        pool.acquire(request, bob, ttl_s=30, timeout_s=0)
    queued, gave_up = ([e for e in pool.history() if e.kind == kind] for kind in ("queued", "gave_up"))
    assert len(queued) == len(gave_up) == 1
    assert queued[0].queue_id is not None and gave_up[0].queue_id == queued[0].queue_id
    assert queued[0].holder == gave_up[0].holder == "bob@h2 pid 7 job gh-9"
    assert LeaseRequest.from_json(queued[0].detail) == request
    assert gave_up[0].detail == f"waited 0s for {request.describe()}"
    held.release()


@pytest.mark.parametrize(("settings", "complaint"), [
    ({"liveness_s": 0.0}, "liveness_s must be finite and > 0, got 0.0"),
    ({"liveness_s": float("inf")}, "liveness_s must be finite and > 0, got inf"),
])
def test_a_pool_refuses_a_liveness_bound_that_bounds_nothing(sqlite_pool_url, settings, complaint):
    with pytest.raises(ValueError, match=f"^{re.escape(complaint)}$"):
        Pool.open(sqlite_pool_url, PoolConfig(url=sqlite_pool_url, **settings))


@pytest.mark.parametrize("window", [-1.0, float("inf")])
def test_a_pool_refuses_a_failure_window_that_is_no_window(sqlite_pool_url, window):
    with pytest.raises(ValueError, match=f"^failure_window_s must be finite and >= 0, got {window}$"):
        Pool.open(sqlite_pool_url, failure_window_s=window)


def test_a_pool_opened_without_settings_has_the_defaults_for_its_own_url(sqlite_pool_url):
    with Pool.open(sqlite_pool_url) as pool:
        assert pool.settings == PoolConfig(url=sqlite_pool_url)
        assert pool.waiter_stale_s == 30.0


def test_without_a_liveness_bound_a_device_is_leased_however_long_ago_it_was_seen(pool_url):
    with Pool.open(pool_url, PoolConfig(url=pool_url, liveness_s=None)) as pool:
        pool.sync([fake_device("dev0")])
        HandClock(pool=pool).t += 10 * 24 * 3600  # ten days on the pool's clock, never seen since
        assert pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0).serial == "dev0"


def test_with_a_liveness_bound_a_device_not_seen_within_it_is_not_leased(pool_url):
    with Pool.open(pool_url, PoolConfig(url=pool_url, liveness_s=120)) as pool:
        pool.sync([fake_device("dev0")])
        HandClock(pool=pool).t += 121
        with pytest.raises(LeaseTimeout):
            pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0)
        pool.sync([fake_device("dev0")])  # seen again
        assert pool.acquire(LeaseRequest(), ttl_s=30, timeout_s=0).serial == "dev0"
