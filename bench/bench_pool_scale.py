#!/usr/bin/env python3
"""The pool at farm scale: 1,000 devices on 20 adb servers of 12 SoCs with tags, 500 waiters of mixed
requests, on SQLite and PostgreSQL (``python bench/bench_pool.py --scale``, or this file).

    python bench/bench_pool_scale.py                          # both backends, 1000 devices, 500 waiters
    python bench/bench_pool_scale.py --backends sqlite --seconds 10 --procs 10 --threads 50
    python bench/bench_pool_scale.py --backends postgres,postgres-flush   # WAL flush under / after the lock

Waiters: ``--procs`` real processes (each opens its own Pool, as CI jobs do) of ``--threads`` threads
each, every thread one waiter that leases, holds (``--hold-ms``, a random 0.5x-1.5x), releases and asks
again: 500 waiters are not 500 processes on a 2-core host, so most are threads sharing their process's
Pool (said in the output). Requests, by weight: a SoC (45 %), a SoC and a tag (15 %), an HTP arch floor
(10 %), one serial (5 %), anything (25 %); SoCs asked for by popularity, so the popular SoCs' devices are
contended (waiters queue) while others stay free: dispatch then runs against a long queue and many free
devices that match no waiter, the case that costs it most.

Measured over the steady window, in one run:
- grant latency: from when a waiter could have had its device (its request, or the release of the
  device it got, whichever was later) until acquire returned it (p50/p99);
- lock hold per write: the write transactions of all the waiters, the measured processes' and the
  simulator's (each request, release and poll of its queue rows: the writes of 480 waiters, whose
  p99 is the pool's as much as the 20 measured ones'), committed in the window, from the pool lock
  granted to the commit done, as the store measures it (``Store.on_write_held``) (p50/p99, and
  writes/s; each side's own and the whole run's p99 are printed after the table);
- utilisation of the contended SoCs' devices: held time over devices x window;
- double leases, checked outside the pool: overlapping holds of one device (must be 0);
- measured waits that timed out inside the window (a wait cut off by the window's end is not one).

Targets: grant p99 < 20 ms, lock hold p99 < 5 ms, no double lease, on each backend; one line each
says met or MISSED (``--target KEY=LIMIT`` sets one for a run); exit 1 when one is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_pool import DEFAULT_PG_URL, flush_after_lock, percentile, postgres_url  # noqa: E402
from benchlib import Target, add_target_option, judge, print_verdicts, targets_met  # noqa: E402
from benchlib import with_overrides  # noqa: E402

TARGETS = (Target("grant_p99", "grant p99", "<", 20.0, " ms", ".2f"),
           Target("hold_p99", "lock hold p99 (all waiters' writes)", "<", 5.0, " ms", ".2f"),
           Target("double_leases", "double leases", "<=", 0, "", ".0f"))
SOCS = [("SM8750", "v79"), ("SM8650", "v75"), ("SM8550", "v73"), ("SM8475", "v69"), ("SM8450", "v69"),
        ("SM7675", "v73"), ("SM7550", "v73"), ("SM8350", "v68"), ("SM7475", "v69"), ("SM6450", "v73"),
        ("SM8250", "v66"), ("SM7325", "v68")]
TAGS = ["usb3", "rooted", "flagship", "lab-a", "lab-b"]


def fleet(devices: int, servers: int) -> list[dict]:
    """The devices: SoCs dealt round-robin over the servers, two tags each, by seed."""
    rng = random.Random(7)
    out = []
    for i in range(devices):
        soc, arch = SOCS[i % len(SOCS)]
        out.append({"serial": f"R{i:05d}", "server": f"10.0.{i % servers}.1:15037", "soc": soc,
                    "htp_arch": arch, "tags": sorted(rng.sample(TAGS, 2))})
    return out


def requests(rng: random.Random, devices: list[dict]) -> dict:
    """One mixed request, as LeaseRequest keyword arguments (JSON)."""
    # SoC popularity: the first three SoCs take most of the asks (the contended ones).
    soc = rng.choices([s for s, _ in SOCS], weights=[30, 25, 20] + [3] * (len(SOCS) - 3))[0]
    kind = rng.choices(["soc", "soc+tag", "arch", "serial", "any"], weights=[45, 15, 10, 5, 25])[0]
    if kind == "soc":
        return {"socs": [soc]}
    if kind == "soc+tag":
        return {"socs": [soc], "tags": [rng.choice(TAGS)]}
    if kind == "arch":
        return {"min_htp_arch": rng.choice(["v73", "v75"])}
    if kind == "serial":
        return {"serial": rng.choice(devices)["serial"]}
    return {}


# -- the worker process -----------------------------------------------------------------------------

def worker(spec: dict) -> None:
    from farm.errors import LeaseTimeout
    from farm.pool import Holder, LeaseRequest, Pool

    cycles: list[tuple] = []
    holds: list[tuple[float, float]] = []  # (committed (wall), seconds held)
    timeouts = 0  # measured waits the window should have served
    lock = threading.Lock()
    flush_after_lock(spec["flush_after"])
    with Pool.open(spec["url"]) as pool:
        def held(seconds: float) -> None:
            with lock:
                holds.append((time.time(), seconds))

        pool.store.on_write_held = held  # the store's own measure: lock granted .. commit done
        print("ready", flush=True)
        go_at, stop_at = map(float, sys.stdin.readline().split())
        devices = spec["devices"]

        def waiter(k: int) -> None:
            nonlocal timeouts
            rng = random.Random(spec["seed"] * 1000 + k)
            holder = Holder.current(purpose=f"bench-{k}")
            time.sleep(max(0.0, go_at - time.monotonic()) + rng.uniform(0, 0.2))
            while (asked := time.monotonic()) < stop_at:
                request = LeaseRequest(**requests(rng, devices))
                asked_wall = time.time()
                try:  # no longer than the window and a little: past it nobody releases any more
                    lease = pool.acquire(request, holder, ttl_s=120,
                                         timeout_s=max(1.0, stop_at - asked + 5))
                except LeaseTimeout:
                    if time.monotonic() < stop_at:
                        with lock:
                            timeouts += 1
                    continue
                acquired, acquired_wall = time.monotonic(), time.time()
                time.sleep(spec["hold_s"] * rng.uniform(0.5, 1.5))
                release_wall = time.time()
                pool.release(lease.token)
                with lock:
                    cycles.append((lease.serial, asked_wall, acquired_wall, release_wall, True))

        threads = [threading.Thread(target=waiter, args=(k,)) for k in range(spec["threads"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(json.dumps({"cycles": cycles, "holds": holds, "timeouts": timeouts}))


def simulator(spec: dict) -> None:
    """``spec["waiters"]`` waiters in one process, without a thread each: queue rows of mixed requests
    that the pool's dispatch serves like anyone's (a transaction each, as an acquire writes),
    refreshed (polled) together four times a second; each
    lease granted to one is held, then released, and the waiter queues again. They keep the queue
    long and the devices turning over, as 500 CI jobs would, without 500 Python processes on this
    host's cores."""
    from farm.pool import Holder, LeaseRequest, Pool
    from farm.pool.leases import dispatch_entry
    from farm.pool.leases import enqueue_entry

    rng = random.Random(spec["seed"])
    flush_after_lock(spec["flush_after"])
    with Pool.open(spec["url"]) as pool:
        sim_holds: list[tuple[float, float]] = []  # (committed (wall), seconds held)
        pool.store.on_write_held = lambda seconds: sim_holds.append((time.time(), seconds))
        holder = Holder.current(purpose="bench-simulated")
        print("ready", flush=True)
        go_at, stop_at = map(float, sys.stdin.readline().split())
        time.sleep(max(0.0, go_at - time.monotonic()))
        mine: dict[int, float] = {}  # queue id -> when it asked (wall)
        held: dict[str, tuple] = {}  # token -> (release at (monotonic), serial, asked, granted)
        cycles: list[tuple] = []

        def enqueue(n: int) -> None:
            for _ in range(n):  # a transaction each, as each waiter's acquire would write
                with pool._write() as txn:
                    request = LeaseRequest(**requests(rng, spec["devices"]))
                    queue_id = enqueue_entry(txn, request, holder, 120.0).id
                    mine[queue_id] = time.time()
                    dispatch_entry(txn, queue_id, request, pool.liveness_s)

        enqueue(spec["waiters"])
        while time.monotonic() < stop_at:
            time.sleep(0.25)
            with pool._write() as txn:
                txn.run("UPDATE queue SET polled = ? WHERE holder_pid = ? AND purpose = ?",
                        (txn.now, holder.pid, holder.purpose))
                ids = sorted(mine)
                granted = txn.all(f"SELECT token, queue_id, serial, created FROM leases WHERE ended IS NULL AND queue_id IN "
                                  f"({', '.join('?' * len(ids))})", ids) if ids else []
            now = time.monotonic()
            for g in granted:
                asked = mine.pop(int(g["queue_id"]))
                held[g["token"]] = (now + spec["hold_s"] * rng.uniform(0.5, 1.5), g["serial"], asked,
                                    float(g["created"]))
            done = [t for t, h in held.items() if h[0] <= now]
            for token in done:
                released = time.time()
                pool.release(token)
                _, serial, asked, granted_at = held.pop(token)
                cycles.append((serial, asked, granted_at, released, False))
            if done:
                enqueue(len(done))
        for token, (_, serial, asked, granted_at) in held.items():
            cycles.append((serial, asked, granted_at, time.time(), False))
            pool.release(token)
        with pool._write() as txn:
            for queue_id in mine:
                txn.run("DELETE FROM queue WHERE id = ?", (queue_id,))
    print(json.dumps({"cycles": cycles, "holds": [], "sim_holds": sim_holds}))


# -- analysis ---------------------------------------------------------------------------------------

def grant_latencies(cycles: list[tuple], start: float, end: float) -> list[float]:
    """Per cycle that asked in the window: acquired - max(asked, release of that device before)."""
    by_serial: dict[str, list[tuple]] = {}
    for c in sorted(cycles, key=lambda c: c[2]):
        by_serial.setdefault(c[0], []).append(c)
    out = []
    for holds in by_serial.values():
        prev_release = -float("inf")
        for serial, asked, acquired, released, measured in holds:
            if measured and start <= asked < end:
                out.append(acquired - max(asked, prev_release))
            prev_release = released
    return out


def double_leases(cycles: list[tuple]) -> int:
    overlaps = 0
    by_serial: dict[str, list[tuple]] = {}
    for c in sorted(cycles, key=lambda c: c[2]):
        by_serial.setdefault(c[0], []).append(c)
    for holds in by_serial.values():
        latest = -float("inf")
        for _, _, acquired, released, _ in holds:
            if acquired < latest:
                overlaps += 1
            latest = max(latest, released)
    return overlaps


def run_backend(url: str, args: argparse.Namespace, *, flush_after: bool = False) -> dict:
    from farm.device.probe import DeviceInfo
    from farm.pool import Pool

    devices = fleet(args.devices, args.servers)
    with Pool.open(url) as pool:
        pool.sync([DeviceInfo(serial=d["serial"], server=d["server"], soc=d["soc"], htp_arch=d["htp_arch"],
                              tags=tuple(d["tags"]), virtual=False) for d in devices],
                  servers=sorted({d["server"] for d in devices}))
    workers = []
    if args.simulated:
        spec = {"url": url, "waiters": args.simulated, "hold_s": args.hold_ms / 1000, "seed": 999,
                "flush_after": flush_after,
                "devices": [{"serial": d["serial"]} for d in devices]}
        workers.append(subprocess.Popen([sys.executable, __file__, "--simulator", json.dumps(spec)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for i in range(args.procs):
        spec = {"url": url, "threads": args.threads, "hold_s": args.hold_ms / 1000, "seed": i,
                "flush_after": flush_after,
                "devices": [{"serial": d["serial"]} for d in devices]}
        workers.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for w in workers:
        if w.stdout.readline().strip() != "ready":
            raise SystemExit(f"a worker failed to start ({w.wait()})")
    go_at = time.monotonic() + 0.5
    stop_at = go_at + args.seconds
    wall_go = time.time() + 0.5
    for w in workers:
        w.stdin.write(f"{go_at} {stop_at}\n")
        w.stdin.close()
    cycles, holds, timeouts, sim_holds = [], [], 0, []
    for w in workers:
        out = w.stdout.read()
        if w.wait() != 0:
            raise SystemExit(f"a worker failed ({w.returncode})")
        r = json.loads(out)
        cycles += [tuple(c) for c in r["cycles"]]
        holds += r["holds"]
        timeouts += r.get("timeouts", 0)
        sim_holds += r.get("sim_holds", [])
    start, end = wall_go + args.warmup, wall_go + args.seconds
    grants = grant_latencies(cycles, start, end)
    own = [s for t, s in holds if start <= t < end]
    sim = [s for t, s in sim_holds if start <= t < end]
    writes = own + sim  # every waiter's: at the defaults the measured processes are 20 of 500
    contended = {d["serial"] for d in devices if d["soc"] in {s for s, _ in SOCS[:3]}}
    held = sum(max(0.0, min(c[3], end) - max(c[2], start)) for c in cycles if c[0] in contended)
    return {"grant_p50_ms": statistics.median(grants) * 1000, "grant_p99_ms": percentile(grants, 0.99) * 1000,
            "grants": len(grants), "hold_p50_ms": ms(statistics.median, writes),
            "hold_p99_ms": ms(p99, writes), "writes_per_s": len(writes) / (end - start),
            "writes": len(writes), "own_writes": len(own), "own_hold_p99_ms": ms(p99, own),
            "run_hold_p99_ms": ms(p99, [s for _, s in holds + sim_holds]),
            "utilisation": held / (len(contended) * (end - start)), "double_leases": double_leases(cycles),
            "cycles_per_s": len([c for c in cycles if start <= c[1] < end]) / (end - start),
            "simulated_cycles": sum(1 for c in cycles if not c[4]), "timeouts": timeouts,
            "sim_hold_p50_ms": ms(statistics.median, sim), "sim_hold_p99_ms": ms(p99, sim),
            "sim_hold_max_ms": ms(max, sim), "sim_writes": len(sim)}


def p99(values: list[float]) -> float:
    return percentile(values, 0.99)


def ms(stat, values: list[float]) -> float:
    """``stat`` of ``values`` in ms; NaN for no values (a target on it is then missed, not met)."""
    return stat(values) * 1000 if values else float("nan")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--simulator":
        simulator(json.loads(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", action="store_true", help="(accepted: bench_pool.py --scale runs this)")
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument("--procs", type=int, default=20, help="real waiter processes (measured)")
    parser.add_argument("--threads", type=int, default=1, help="waiters (threads) per real process")
    parser.add_argument("--simulated", type=int, default=480,
                        help="waiters simulated in one process (queue rows, served by dispatch)")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--hold-ms", type=float, default=2000.0, help="mean time a lease is held")
    parser.add_argument("--backends", default="sqlite,postgres")
    add_target_option(parser, TARGETS)
    args = parser.parse_args()
    targets = with_overrides(TARGETS, args.target)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-pool-scale-") as tmp:
        for name in args.backends.split(","):
            if name == "sqlite":
                results[name] = run_backend(f"sqlite:///{tmp}/pool.db", args)
                continue
            import psycopg

            base = os.environ.get("PTEFARM_TEST_PG_URL") or DEFAULT_PG_URL
            schema = f"ptefarm_bench_{secrets.token_hex(4)}"
            with psycopg.connect(base, autocommit=True) as admin:
                admin.execute(f'CREATE SCHEMA "{schema}"')
                try:
                    results[name] = run_backend(postgres_url(base, schema), args,
                                                flush_after=name == "postgres-flush")
                finally:
                    admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    waiters = args.procs * args.threads + args.simulated
    print(f"{args.devices} devices on {args.servers} adb servers, {len(SOCS)} SoCs, {len(TAGS)} tags; "
          f"{waiters} waiters: {args.procs} real processes x {args.threads} thread(s), measured, and "
          f"{args.simulated} simulated in one process (queue rows served by the pool's dispatch, "
          f"polled together); hold {args.hold_ms:g} ms mean, "
          f"{args.seconds:g} s ({args.warmup:g} s warm-up), {os.cpu_count()} CPUs")
    print(f"{'backend':<14} {'grant p50':>9} {'p99 ms':>7} {'n':>6} {'hold p50':>8} {'p99 ms':>7} "
          f"{'writes/s':>8} {'util %':>6} {'cycles/s':>8} {'double':>6} {'timeouts':>8}")
    verdicts = []
    for name, r in results.items():
        print(f"{name:<14} {r['grant_p50_ms']:>9.2f} {r['grant_p99_ms']:>7.2f} {r['grants']:>6} "
              f"{r['hold_p50_ms']:>8.2f} {r['hold_p99_ms']:>7.2f} {r['writes_per_s']:>8.0f} "
              f"{100 * r['utilisation']:>6.1f} {r['cycles_per_s']:>8.1f} {r['double_leases']:>6} {r['timeouts']:>8}")
        verdicts += judge((replace(t, what=f"{name} {t.what}"), r[figure]) for t, figure in (
            (targets["grant_p99"], "grant_p99_ms"), (targets["hold_p99"], "hold_p99_ms"),
            (targets["double_leases"], "double_leases")))
    for name, r in results.items():  # each side's share of the hold column, and the whole run's
        print(f"{name:<14} lock hold of the {r['writes']} writes in the window: the measured processes' "
              f"{r['own_writes']}, p99 {r['own_hold_p99_ms']:.2f} ms; the simulator's {r['sim_writes']} (a "
              f"request a transaction, as each waiter's; one poll of all its queue rows 4 times a second), "
              f"p50 {r['sim_hold_p50_ms']:.2f} ms, p99 {r['sim_hold_p99_ms']:.2f} ms, max "
              f"{r['sim_hold_max_ms']:.2f} ms; the whole run's writes (warm-up and wind-down too) p99 "
              f"{r['run_hold_p99_ms']:.2f} ms")
    code = print_verdicts(verdicts)
    parts = [f"{n}: grant p99 {r['grant_p99_ms']:.1f} ms, lock hold p99 {r['hold_p99_ms']:.2f} ms "
             f"(all {waiters} waiters' writes), "
             f"util {100 * r['utilisation']:.0f} %" for n, r in results.items()]
    print(f"summary: {'; '.join(parts)}; double leases "
          f"{sum(r['double_leases'] for r in results.values())}; measured waits timed out in the window "
          f"{sum(r['timeouts'] for r in results.values())}; {targets_met(verdicts)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
