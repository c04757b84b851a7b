"""Many processes against one pool: exclusivity, queue order, and recovery from a killed holder."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from farm.errors import LeaseTimeout
from farm.pool import AVAILABLE, Holder, LeaseRequest, Pool
from farm.procs import wait_until
from tests.support.pool import (
    check_event_log,
    collect,
    fake_device,
    reaped,
    start_worker,
)

PRIORITIES = ["pr", "nightly", "release", "adhoc"]
REQUESTS = [{"socs": ["SM8650"]}, {}, {"socs": ["SM8550"]}, {"min_htp_arch": "v75"}]
CYCLES = 4


def _wait_for_files(directory: Path, names: list[str], procs: list, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while not all((directory / n).exists() for n in names):
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            _, err = dead[0].communicate()
            pytest.fail(f"worker exited early ({dead[0].returncode}): {err[-2000:]}")
        if time.monotonic() > end:
            pytest.fail(f"workers not ready after {deadline_s}s")
        time.sleep(0.02)


def test_many_processes_contend_for_few_devices(pool_url, tmp_path):
    with Pool.open(pool_url) as pool:
        pool.sync([fake_device("p0", "SM8650", "v75"), fake_device("p1", "SM8650", "v75"),
                   fake_device("q0", "SM8550", "v73"), fake_device("q1", "SM8550", "v73")])
        devices = {d.device.serial: d.device for d in pool.status().devices}
    markers, ready, go = tmp_path / "markers", tmp_path / "ready", tmp_path / "go"
    markers.mkdir()
    ready.mkdir()
    specs: dict[str, dict] = {}
    for i in range(16):
        specs[f"w{i:02d}"] = {
            "request": {**REQUESTS[i % len(REQUESTS)], "priority": PRIORITIES[i % 4]},
            # Two impatient workers may time out; the rest wait long enough to be served.
            "timeout_s": 0.05 if i in (5, 11) else 60, "cycles": CYCLES, "hold_s": 0.02,
        }
    for i in range(2):  # nobody can serve these: every request must end in a timeout (a request
        # no device could ever match is refused at once, so these exclude the devices that could)
        specs[f"x{i}"] = {"request": {"socs": ["SM8650"], "exclude": ["p0", "p1"],
                                      "priority": "release"}, "timeout_s": 0.2,
                          "cycles": 2, "hold_s": 0}
    procs = {}
    with reaped(procs):
        for name, spec in specs.items():
            spec.update(ttl_s=10, markers=str(markers), ready=str(ready), go=str(go))
            procs[name] = start_worker("contend", pool_url, name, json.dumps(spec))
        _wait_for_files(ready, list(specs), list(procs.values()), 120)
        go.touch()
        results = collect(procs)

    served_tokens = set()
    for name, (out, err) in results.items():
        assert procs[name].returncode == 0, f"{name}: {err[-2000:]}"
        lines = [json.loads(line) for line in out.splitlines()]
        assert len(lines) == specs[name]["cycles"], f"{name}: {out}"
        assert {line["outcome"] for line in lines} <= {"served", "timeout"}, f"{name}: {out}"
        served_tokens |= {line["token"] for line in lines if line["outcome"] == "served"}
        if name.startswith("x"):
            assert all(line["outcome"] == "timeout" for line in lines)
            assert "no device in the pool matches" in lines[0]["message"]
        elif specs[name]["timeout_s"] > 1:
            assert all(line["outcome"] == "served" for line in lines), f"{name}: {out}"

    with Pool.open(pool_url) as pool:
        events = pool.history(limit=None)
        counts = check_event_log(events, devices)
        status = pool.status()
    assert {e.token for e in events if e.kind == "leased"} == served_tokens
    assert counts["leased"] == counts["ended"] == len(served_tokens)
    assert not [e for e in events if e.kind == "expired"]  # the heartbeat kept every lease alive
    assert counts["from_queue"] > 0, "no request ever waited: the test did not contend"
    assert all(d.device.state == AVAILABLE for d in status.devices) and status.queue == []


def test_killed_holder_loses_device_after_ttl(pool_url):
    with Pool.open(pool_url, poll_s=0.02) as pool:
        pool.sync([fake_device("dev0")])
        # TTL 2 s with a heartbeat every 0.1 s: alive, the holder keeps the device past its TTL.
        holder = start_worker("hold", pool_url, json.dumps({"serial": "dev0"}), "2", "0.1")
        try:
            line = holder.stdout.readline()
            assert line, holder.stderr.read()
            held = json.loads(line)
            with pytest.raises(LeaseTimeout) as err:
                pool.acquire(LeaseRequest(serial="dev0"), ttl_s=30, timeout_s=3)
            assert f"pid {held['pid']}" in str(err.value)

            got: dict[str, object] = {}

            def next_waiter() -> None:
                with Pool.open(pool_url, poll_s=0.02) as own:
                    got["lease"] = own.acquire(LeaseRequest(serial="dev0"), Holder("next", "h", 1),
                                               ttl_s=30, timeout_s=60)

            waiter = threading.Thread(target=next_waiter)
            waiter.start()
            assert wait_until(lambda: bool(pool.status().queue), timeout=60), \
                "the next waiter is not in the queue after 60 s"
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
            waiter.join(60)
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
            holder.stdout.close()
            holder.stderr.close()
        lease = got["lease"]
        assert lease.serial == "dev0" and lease.token != held["token"]
        tail = [(e.kind, e.token) for e in pool.history(serial="dev0")][-2:]
        assert tail == [("expired", held["token"]), ("leased", lease.token)]
        pool.release(lease.token)


def test_killed_waiter_leaves_the_queue(pool_url):
    """A waiter killed while queued stops polling; it is dropped and never granted a device."""
    with Pool.open(pool_url, poll_s=0.02, waiter_stale_s=0.5) as pool:
        pool.sync([fake_device("dev0")])
        held = pool.acquire(LeaseRequest(), ttl_s=60, timeout_s=0)
        waiter = start_worker("hold", pool_url, json.dumps({"serial": "dev0"}), "60", "1")
        try:
            queued = wait_until(lambda: bool(pool.status().queue) or waiter.poll() is not None,
                                timeout=60)
            assert waiter.poll() is None, f"the waiter exited: {waiter.stderr.read()}"
            assert queued, "the waiter is not in the queue after 60 s"
            queue_id = pool.status().queue[0].id
            os.kill(waiter.pid, signal.SIGKILL)
            waiter.wait()
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
            waiter.stdout.close()
            waiter.stderr.close()
        time.sleep(0.7)  # longer than waiter_stale_s without a poll from it
        pool.release(held.token)
        assert [d.device.state for d in pool.status().devices] == [AVAILABLE]
        assert pool.status().queue == []
        abandoned = [e for e in pool.history() if e.kind == "abandoned"]
        assert [e.queue_id for e in abandoned] == [queue_id]
