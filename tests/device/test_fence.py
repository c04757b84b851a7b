"""Fencing: a holder whose lease ran out never touches the device again.

``Lease.check()`` keeps a local deadline (last successful acquire/renew + TTL - margin) and needs no
database call, so a holder stopped (SIGSTOP) past its TTL stops at its first action after it resumes,
whatever its heartbeat thread does meanwhile.

Run as a module, this file is the holder process of the SIGSTOP test:
    python -m tests.device.test_fence hold POOL_URL HOST:PORT SERIAL TTL DIR
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from farm.errors import InfraError, LeaseError, LeaseLost, PoolError
from farm.pool import Holder, LeaseRequest, Pool
from farm.db.base import PoolLost
from farm.pool.leases import fence_clock, fence_margin
from farm.procs import wait_until
from tests.support.pool import PROMPT_S, REPO, BeatClock, HandClock, fake_device

# -- the cheap check ---------------------------------------------------------------------------------


class _NoDatabase:
    """Stands in for the pool's store: any use fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"Lease.check() used the database ({name})")


def test_check_is_local_and_fences_past_the_deadline(pool):
    pool.sync([fake_device("dev0")])
    pool.clock = clock = HandClock(pool=pool)
    lease = pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30.0, timeout_s=5)
    store, pool.store = pool.store, _NoDatabase()
    try:
        lease.check()  # fresh: fine, and no database call
        assert 0 < lease.remaining_s() <= 30.0
        clock.t += 30.0  # no heartbeat: the deadline passes (minus the margin)
        with pytest.raises(LeaseLost, match="dev0.*not renewed for over its TTL") as caught:
            lease.check()
        assert isinstance(caught.value, InfraError) and caught.value.serial == "dev0"
        assert isinstance(lease.lost, LeaseError)
    finally:
        pool.store = store
    clock.t += 1.0  # and past the pool's own expiry: a renewal now is refused
    with pytest.raises(LeaseError, match="expired"):
        lease.renew()
    with pytest.raises(LeaseLost):
        lease.check()
    with pytest.raises(LeaseError, match="cannot release.*expired"):
        lease.release()


def _held_on_a_hand_clock(pool, ttl: float = 30.0):
    """dev0, leased for ``ttl`` by a holder whose clock the test moves."""
    pool.sync([fake_device("dev0")])
    pool.clock = clock = HandClock()
    return pool.acquire(LeaseRequest(serial="dev0"), ttl_s=ttl, timeout_s=5), clock


def test_renewal_moves_the_deadline_and_lost_fences_at_once(pool):
    ttl, margin = 30.0, fence_margin(30.0)
    lease, clock = _held_on_a_hand_clock(pool, ttl)
    first_deadline = lease.valid_until
    assert first_deadline is not None and first_deadline <= clock.t + ttl - margin
    for _ in range(4):  # 80 s on the holder's clock, well past the first deadline
        clock.t += 20.0
        lease.renew()
        # Each renewal's deadline counts from its own start: the pool's fresh TTL, less the margin.
        assert lease.valid_until == pytest.approx(clock.t + ttl - margin, abs=1e-3)
        lease.check()
    assert clock.t > first_deadline and lease.remaining_s() == pytest.approx(ttl - margin, abs=1e-3)
    clock.t += ttl - margin + 1e-2  # just past the deadline: fenced, although the pool still holds it
    with pytest.raises(LeaseLost, match="not renewed for over its TTL"):
        lease.check()
    lease.lost = None
    lease.renew()
    lease.lost = LeaseError("taken away")  # what the heartbeat sets when a renewal is refused
    with pytest.raises(LeaseLost, match="taken away"):
        lease.check()
    lease.release()


def test_a_renewal_that_finishes_late_never_pulls_the_fence_back(pool):
    # The heartbeat and a check that resyncs can both renew. One that began earlier and is answered
    # last counts from its own, earlier start: the fence keeps the later deadline it already had.
    ttl, margin = 30.0, fence_margin(30.0)
    lease, clock = _held_on_a_hand_clock(pool, ttl)
    real = pool.renew

    def overtaken(token, ttl_s):
        pool.renew = real
        clock.t += 5.0  # meanwhile, another renewal starts 5 s later and is answered first
        lease.renew()
        return real(token, ttl_s)

    started = clock.t
    pool.renew = overtaken
    lease.renew()
    assert lease.valid_until == pytest.approx(started + 5.0 + ttl - margin, abs=1e-3)
    lease.release()


def test_the_fence_closes_exactly_at_its_deadline_and_says_by_how_much(pool):
    lease, clock = _held_on_a_hand_clock(pool)
    deadline = lease.valid_until
    clock.t = deadline - 0.5  # half a second left: still ours, and no database call
    store, pool.store = pool.store, _NoDatabase()
    try:
        lease.check()
        clock.t = deadline  # no time left is not time left
        with pytest.raises(LeaseLost) as at_deadline:
            lease.check()
    finally:
        pool.store = store
    assert at_deadline.value.serial == "dev0"
    assert "fence deadline passed 0.0s ago" in str(at_deadline.value)
    lease.lost = None  # (the pool still holds it: renewed, then let lapse 2.5 s past the deadline)
    lease.renew()
    clock.t = lease.valid_until + 2.5
    with pytest.raises(LeaseLost) as late:
        lease.check()
    assert str(late.value) == (
        f"lease on dev0 lost: lease {lease.token[:8]} on dev0 not renewed for over its TTL of 30s "
        f"(fence deadline passed 2.5s ago: the holder stalled, or the pool could not be reached); "
        f"the pool may have given the device to another holder")
    lease.release()


def test_heartbeat_keeps_the_fence_open(pool):
    # Twice the TTL on the holder's clock and the pool's alike: only the heartbeat's renewals keep
    # the fence open, at every beat, and leave it a full TTL (less the margin) after the last.
    pool.sync([fake_device("dev0")])
    pool.clock = clock = BeatClock(pool=pool, beats=6)
    ttl = 30.0
    with pool.acquire(LeaseRequest(serial="dev0"), ttl_s=ttl, timeout_s=5, heartbeat_s=10.0) as lease:
        first = lease.info
        for _ in range(6):  # 60 s
            assert clock.beats.acquire(timeout=PROMPT_S)
            lease.check()
        assert wait_until(lambda: lease.info.renewed - first.renewed >= 60.0, timeout=PROMPT_S)
        lease.check()
        assert lease.remaining_s() == pytest.approx(ttl - fence_margin(ttl), abs=1e-3)


@pytest.mark.parametrize(("heartbeat_s", "interval"), [(None, 10.0), (4.0, 4.0)])
def test_the_heartbeat_renews_every_third_of_the_ttl_unless_told(pool, heartbeat_s, interval):
    pool.sync([fake_device("dev0")])
    pool.clock = clock = BeatClock()
    lease = pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30.0, timeout_s=5, heartbeat_s=heartbeat_s)
    with lease:
        for _ in range(3):
            assert clock.beats.acquire(timeout=PROMPT_S)
        thread = lease._thread
        # A daemon thread named for the device: a holder that exits is not kept alive by it, and
        # a stack dump says whose heartbeat it is.
        assert thread is not None and thread.daemon and thread.name == "lease-heartbeat-dev0"
        lease.start_heartbeat()  # a second start is the same heartbeat, not another thread
        assert lease._thread is thread
        lease.check()  # 3 intervals of the hand clock later: the renewals kept it open
    assert clock.waits[:3] == [interval] * 3
    assert not thread.is_alive()


def _failing_renewals(pool, *errors):
    """``pool.renew`` raising each of ``errors`` once, in turn, then renewing for real."""
    real, left = pool.renew, list(errors)

    def renew(token, ttl_s):
        if left:
            raise left.pop(0)
        return real(token, ttl_s)
    pool.renew = renew


def test_the_heartbeat_rides_out_an_outage_and_says_so(pool, caplog):
    # A pool that does not answer one renewal is an outage the lease can outlive (the database may be
    # back before the TTL runs out): the heartbeat warns, in words an operator can act on, and renews
    # at its next beat. The lease is not lost for it.
    pool.sync([fake_device("dev0")])
    pool.clock = clock = BeatClock()
    lease = pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30.0, timeout_s=5)
    first = lease.info
    _failing_renewals(pool, PoolError("pool at sqlite:///x unreachable: disk I/O error"))
    with caplog.at_level("WARNING", logger="farm.pool.leases"), lease:
        for _ in range(3):
            assert clock.beats.acquire(timeout=PROMPT_S)
        assert wait_until(lambda: lease.info.token == first.token and lease.info is not first, PROMPT_S)
        assert lease.lost is None
        lease.check()
    warnings = [r.getMessage() for r in caplog.records if r.name == "farm.pool.leases"]
    assert warnings[0] == (f"lease {lease.token[:8]} on dev0: renewal failed, retrying in 10.0s: "
                           f"pool at sqlite:///x unreachable: disk I/O error")


@pytest.mark.parametrize("error", [
    LeaseError("lease 1234abcd on dev0 has ended (expired at 12:00:00)"),
    PoolLost("the pool at sqlite:///x is gone: its file was replaced; its leases are lost"),
], ids=["lease-ended", "pool-gone"])
def test_a_renewal_the_pool_refuses_loses_the_lease_for_good(pool, error):
    # Not an outage: the lease ended, or the pool that granted it is gone (a new, empty one at the
    # same address would lease the device to anyone). The heartbeat stops and the fence is shut, in
    # the pool's own words.
    pool.sync([fake_device("dev0")])
    pool.clock = clock = BeatClock()
    lease = pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30.0, timeout_s=5)
    _failing_renewals(pool, error)
    lease.start_heartbeat()
    assert clock.beats.acquire(timeout=PROMPT_S)
    lease._thread.join(PROMPT_S)
    assert not lease._thread.is_alive()  # no retry of a refusal
    assert isinstance(lease.lost, LeaseError) and str(lease.lost) == str(error)
    with pytest.raises(LeaseLost, match=f"lease on dev0 lost: {re.escape(str(error))}"):
        lease.check()


class _SlowReader:
    """A pool store whose reads stall (a GC pause, a loaded host) before they start and again after
    the pool's clock was read in them: a waiter that reads its grant late."""

    def __init__(self, store, stall_s: float):
        self._store, self._stall_s = store, stall_s
        self.reads = 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    @contextmanager
    def read(self):
        self.reads += 1
        time.sleep(self._stall_s)  # granted already, but not reading it yet
        with self._store.read() as txn:
            yield _SlowTxn(txn, self._stall_s)


class _SlowTxn:
    def __init__(self, txn, stall_s: float):
        self._txn, self._stall_s = txn, stall_s

    def __getattr__(self, name):
        return getattr(self._txn, name)

    def all_of(self, *queries):
        rows = self._txn.all_of(*queries)
        time.sleep(self._stall_s)  # the pool's "now" of this read is behind us
        return rows


def _pool_now_minus_fence_clock(pool) -> float:
    """(pool clock) - (fence clock), never more than the true offset: the fence clock is read after
    the pool's, so a deadline converted with it is never later than the true one."""
    with pool.store.read() as txn:
        now = txn.now
    return now - fence_clock()


def test_a_lease_granted_while_waiting_is_fenced_from_its_grant(pool):
    """A waiter granted a lease by another process's release gets the time left of that lease, not a
    fresh TTL from when it noticed: however late it reads its grant, its fence deadline is never
    later than the pool's expiry of the lease minus the margin, on the pool's clock."""
    pool.sync([fake_device("dev0")])
    first = pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30, timeout_s=5)
    ttl, stall = 5.0, 0.4
    with Pool.open(pool.store.url, poll_s=0.02) as other:
        import threading

        other.store = _SlowReader(other.store, stall)
        got = {}
        waiter = threading.Thread(target=lambda: got.setdefault(
            "lease", other.acquire(LeaseRequest(serial="dev0"), ttl_s=ttl, timeout_s=PROMPT_S)))
        waiter.start()
        time.sleep(0.3)
        first.release()
        waiter.join(PROMPT_S)
        lease = got["lease"]
        assert other.store.reads >= 1, "the waiter was to read its grant (late), not to write for it"
        offset = _pool_now_minus_fence_clock(pool)
        deadline_on_pool_clock = lease.valid_until + offset
        latest = lease.info.expires - fence_margin(ttl)
        assert deadline_on_pool_clock <= latest, (
            f"fence deadline {deadline_on_pool_clock - latest:.3f}s past the pool's expiry of the "
            f"lease minus the margin ({fence_margin(ttl)}s)")
        assert 0 < lease.remaining_s() <= ttl - fence_margin(ttl) - stall
        lease.release()


# -- the device refuses a superseded holder --------------------------------------------------------

def test_device_refuses_a_superseded_holder_whose_own_clock_still_trusts_its_lease(sqlite_pool_url,
                                                                                  virtual_farm):
    """The old holder does not know it lost the device (its lease was ended in the pool, its own
    deadline is minutes away, so ``Lease.check`` lets it through): the device itself refuses its
    command once a newer lease has claimed the fence, and the command leaves no trace."""
    from farm.device.discovery import discover, find_device
    from farm.device.fence import FENCED_EXIT, FENCED_MARK, FencedDevice
    from farm.virtual import VirtualDeviceSpec

    (record,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    with Pool.open(sqlite_pool_url, poll_s=0.02) as pool:
        pool.sync(discover([virtual_farm.adb_server]), [virtual_farm.adb_server])
        adb = find_device([virtual_farm.adb_server], record.serial)
        old = pool.acquire(LeaseRequest(serial=record.serial), Holder.current("old holder"),
                           ttl_s=600, timeout_s=10)
        old_device = FencedDevice(adb, old)
        old_device.claim()
        ws = adb.workspace
        assert old_device.shell(f"echo old-0 > {ws}/old-0", timeout=20).exit_code == 0
        # The pool ends the old lease behind its holder's back and grants the device anew.
        pool.release(old.token)
        with pool.acquire(LeaseRequest(serial=record.serial), Holder.current("new holder"),
                          ttl_s=600, timeout_s=10) as new:
            new_device = FencedDevice(adb, new)
            new_device.claim()

            old.check()  # the old holder's own clock still trusts its lease: only the device can stop it
            assert old.remaining_s() > 60
            for check in (False, True):
                with pytest.raises(LeaseLost, match="held by another lease") as caught:
                    old_device.shell(f"echo old-late > {ws}/old-late", timeout=20, check=check)
                assert caught.value.serial == record.serial and FENCED_MARK in str(caught.value)

            # Nothing of it happened on the device; the new holder's commands run as usual.
            probe = new_device.shell(f"test -e {ws}/old-late; echo $?", timeout=20, check=True)
            assert probe.out.strip() == "1", probe
            assert not record.host_path(f"{ws}/old-late").exists()
            assert new_device.shell(f"cat {ws}/old-0", timeout=20, check=True).out == "old-0\n"
            # A command of the holder's own that happens to exit 75 is its result, not a refusal.
            mine = new_device.shell(f"echo {FENCED_MARK} on stdout; exit {FENCED_EXIT}", timeout=20)
            assert mine.exit_code == FENCED_EXIT


# -- a holder stopped past its TTL -------------------------------------------------------------------

def _hold(url: str, server_text: str, serial: str, ttl_s: str, directory: str) -> int:
    """Lease ``serial`` and append a line to a file on the device in a loop, checking the lease before
    each action; ``DIR/pause`` makes it wait between two actions (where the test stops it) until
    ``DIR/resume`` exists. Prints one JSON line per event."""
    from farm.config import AdbServerAddress
    from farm.device.probe import Device
    from farm.device.transport import client_for

    def say(**event) -> None:
        print(json.dumps(event), flush=True)

    gate = Path(directory)
    server = AdbServerAddress.parse(server_text)
    pool = Pool.open(url, poll_s=0.02)
    lease = pool.acquire(LeaseRequest(serial=serial), Holder.current("fencing holder"),
                         ttl_s=float(ttl_s), timeout_s=PROMPT_S)
    lease.start_heartbeat()
    device = Device(client_for(server), serial, server)
    target = f"{device.workspace}/fence.log"
    say(leased=lease.token)
    i = 0
    try:
        while True:
            lease.check()
            device.shell(f"echo holder-{i} >> {target}", timeout=20, check=True)
            say(acted=i)
            i += 1
            if (gate / "pause").exists():
                say(paused=i)
                while not (gate / "resume").exists():
                    time.sleep(0.01)
            time.sleep(0.05)
    except LeaseLost as e:
        say(fenced=str(e), serial=e.serial)
    try:
        lease.release()
    except LeaseError as e:
        say(release_error=str(e))
        return 3
    say(released=True)
    return 0


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_holder_stopped_past_its_ttl_never_acts_again(pool_url, virtual_farm, tmp_path):
    from farm.device.discovery import discover, find_device
    from farm.virtual import VirtualDeviceSpec

    (record,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    ttl = 1.5
    log_file = record.host_path(f"{record.workspace}/fence.log")
    with Pool.open(pool_url, poll_s=0.02) as pool:
        pool.sync(discover([virtual_farm.adb_server]), [virtual_farm.adb_server])
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        holder = subprocess.Popen(
            [sys.executable, "-m", "tests.device.test_fence", "hold", pool_url, str(virtual_farm.adb_server),
             record.serial, str(ttl), str(tmp_path)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            events = []

            def next_event() -> dict:
                line = holder.stdout.readline()
                if not line:
                    pytest.fail(f"holder exited ({holder.wait()}): {holder.stderr.read()[-3000:]}")
                events.append(json.loads(line))
                return events[-1]

            while "acted" not in next_event() or events[-1]["acted"] < 2:
                pass
            (tmp_path / "pause").touch()
            while "paused" not in next_event():
                pass
            holder.send_signal(signal.SIGSTOP)
            acted_before = [f"holder-{e['acted']}" for e in events if "acted" in e]
            assert _lines(log_file) == acted_before

            # Past its TTL, another process (this one) gets the device and uses it.
            time.sleep(ttl + 0.5)
            with pool.acquire(LeaseRequest(serial=record.serial), Holder.current("second holder"),
                              ttl_s=30, timeout_s=20) as second:
                device = find_device([virtual_farm.adb_server], record.serial)
                device.shell(f"echo second-0 >> {device.workspace}/fence.log", timeout=20, check=True)
                (tmp_path / "resume").touch()
                holder.send_signal(signal.SIGCONT)
                out, err = holder.communicate(timeout=60)
                events += [json.loads(line) for line in out.splitlines()]
                second.check()
                device.shell(f"echo second-1 >> {device.workspace}/fence.log", timeout=20, check=True)
        finally:
            if holder.poll() is None:
                holder.send_signal(signal.SIGCONT)
                holder.kill()
                holder.wait()

        # What the device saw: the stopped holder never acted again.
        assert _lines(log_file) == [*acted_before, "second-0", "second-1"]
        after_resume = events[events.index(next(e for e in events if "paused" in e)) + 1:]
        assert not [e for e in after_resume if "acted" in e], events
        fenced = next(e for e in after_resume if "fenced" in e)
        assert fenced["serial"] == record.serial and "lost" in fenced["fenced"]
        # Its release fails, naming why and who holds the device now; the holder exits non-zero.
        release = next(e for e in after_resume if "release_error" in e)["release_error"]
        assert "expired" in release and "second holder" in release, release
        assert holder.returncode == 3, err

        # The pool's log: expired, then the second lease, and nothing of the first holder after it.
        log = [(e.kind, e.token) for e in pool.history(serial=record.serial, limit=None)
               if e.kind in ("leased", "expired", "released")]
        first = events[0]["leased"]
        assert log[:2] == [("leased", first), ("expired", first)], log
        assert [kind for kind, _ in log[2:]] == ["leased", "released"], log
        assert all(token != first for _, token in log[2:])


if __name__ == "__main__":
    if sys.argv[1] != "hold":
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
    sys.exit(_hold(*sys.argv[2:]))


def test_the_fence_counts_time_the_host_spent_suspended(monkeypatch):
    # CLOCK_BOOTTIME, where the platform has it: a laptop or VM suspended past a lease's TTL must find
    # its fence closed on waking (CLOCK_MONOTONIC stands still while suspended); elsewhere monotonic.
    from farm.pool import leases

    read = []
    monkeypatch.setattr(leases.time, "clock_gettime", lambda clock: read.append(clock) or 1234.5)
    monkeypatch.setattr(leases, "_FENCE_CLOCK", 7)
    assert fence_clock() == 1234.5 and read == [7]
    monkeypatch.setattr(leases, "_FENCE_CLOCK", None)
    monkeypatch.setattr(leases.time, "monotonic", lambda: 99.0)
    assert fence_clock() == 99.0 and read == [7]
    if sys.platform == "linux":
        assert getattr(time, "CLOCK_BOOTTIME") is not None


@pytest.mark.parametrize(("ttl", "margin"), [(30.0, 1.0), (10.0, 1.0), (5.0, 0.5), (2.0, 0.2)])
def test_the_fence_margin_is_a_second_or_a_tenth_of_a_short_ttl(ttl, margin):
    assert fence_margin(ttl) == pytest.approx(margin)


class _LingeringClock(BeatClock):
    """Its heartbeat takes a while to notice it was stopped (a loaded host)."""

    def wait(self, event, seconds):
        woken = super().wait(event, seconds)
        if event.is_set():
            time.sleep(0.2)
        return woken


def test_a_lease_given_back_has_no_heartbeat_left_to_renew_it(pool):
    # Release stops the heartbeat and waits for its thread: a renewal after the release would bring
    # a lease the pool had ended back to life under another holder.
    pool.sync([fake_device("dev0")])
    pool.clock = clock = _LingeringClock(beats=1)
    lease = pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30.0, timeout_s=5)
    lease.start_heartbeat()
    assert clock.beats.acquire(timeout=PROMPT_S)
    thread = lease._thread
    lease.release()
    assert thread is not None and not thread.is_alive()
