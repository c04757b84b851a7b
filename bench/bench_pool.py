#!/usr/bin/env python3
"""Pool under contention: how long a released device sits idle while someone waits for it.

    python bench/bench_pool.py                       # 32 processes, 8 devices, 100 ms holds, both backends
    python bench/bench_pool.py --backends sqlite --seconds 5 --profile /tmp/prof
    python bench/bench_pool.py --backends postgres,postgres-flush   # WAL flush under / after the lock
    python bench/bench_pool.py --scale               # 1,000 devices, 500 waiters (bench_pool_scale.py)

Per backend, in one run on one machine, two phases of real processes (each opens its own Pool, as CI
jobs do):
- contended: ``--procs`` processes lease any of ``--devices`` devices, hold each lease ``--hold-ms``
  (sleeping, as a host waits on a phone) and release it, in a loop. Measured over the steady window
  (the first ``--warmup`` seconds are dropped):
  * handoff gap: from the moment a holder calls release while some process is waiting, until the next
    holder of that device has it back from acquire (p50/p99);
  * utilisation: time devices are held (acquire returned .. release called) over devices x window;
  * cycles/s: completed lease cycles;
  * double holds, counted outside the pool twice: overlapping [acquired, release called) intervals of
    one device across processes, and a non-blocking flock(2) per device that every holder takes
    after acquire and drops before release (a second holder finds it taken).
- uncontended: ``--devices`` processes on as many devices (nobody ever waits for a device), same
  loop: acquire latency p50/p99, i.e. the cost of the pool's transactions themselves.

All timestamps are CLOCK_MONOTONIC, which is one clock for every process of the host. The PostgreSQL
pool lives in a fresh schema of $PTEFARM_TEST_PG_URL (default postgresql://postgres@127.0.0.1:5432/test),
dropped afterwards; the SQLite pool in a temporary directory. ``--profile DIR`` writes a cProfile of
worker 0 of each phase (``DIR/<backend>-<phase>.prof``). Backend ``postgres-flush`` is PostgreSQL
committing without the WAL flush under the pool lock and flushing right after, outside it
(``PostgresStore.flush_outside_lock = True``), to compare with the default in one run.
"""

from __future__ import annotations

import argparse
import bisect
import fcntl
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
TARGETS = {"handoff_p99_ms": 10.0, "utilisation": 0.95,
           "uncontended_p99_ms": {"sqlite": 5.0, "postgres": 10.0}}


# -- the worker process -----------------------------------------------------------------------------

def flush_after_lock(on: bool) -> None:
    """Backend ``postgres-flush``: this process's pool commits without the WAL flush under the pool
    lock and flushes right after it (``PostgresStore.flush_outside_lock``)."""
    if on:
        from farm.db.postgres import PostgresStore

        PostgresStore.flush_outside_lock = True


def worker(spec: dict) -> None:
    """One contending process. Prints "ready", waits for the start time on stdin, runs its loop, then
    prints its cycles as one JSON line: [serial, asked, acquired, release_called, released]."""
    from farm.pool import Holder, LeaseRequest, Pool

    flush_after_lock(spec["flush_after"])
    options = {} if spec["poll_s"] is None else {"poll_s": spec["poll_s"]}
    locks = Path(spec["locks"])
    cycles: list[tuple[str, float, float, float, float]] = []
    conflicts = 0
    with Pool.open(spec["url"], **options) as pool:
        holder = Holder.current(purpose="bench")
        request = LeaseRequest()
        fds: dict[str, int] = {}
        print("ready", flush=True)
        go_at, stop_at = map(float, sys.stdin.readline().split())
        time.sleep(max(0.0, go_at - time.monotonic()))
        profiler = None
        if spec["profile"]:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        while (asked := time.monotonic()) < stop_at:
            lease = pool.acquire(request, holder, ttl_s=60, timeout_s=120)
            acquired = time.monotonic()
            fd = fds.get(lease.serial)
            if fd is None:
                fd = fds[lease.serial] = os.open(locks / lease.serial, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                conflicts += 1
                locked = False
            time.sleep(spec["hold_s"])
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
            release_called = time.monotonic()
            pool.release(lease.token)
            cycles.append((lease.serial, asked, acquired, release_called, time.monotonic()))
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(spec["profile"])
    print(json.dumps({"cycles": cycles, "lock_conflicts": conflicts}))


# -- analysis ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cycle:
    serial: str
    asked: float
    acquired: float
    release_called: float
    released: float


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def by_device(cycles: list[Cycle]) -> dict[str, list[Cycle]]:
    devices: dict[str, list[Cycle]] = {}
    for c in sorted(cycles, key=lambda c: c.acquired):
        devices.setdefault(c.serial, []).append(c)
    return devices


def double_holds(cycles: list[Cycle]) -> int:
    """Pairs of holds of one device whose [acquired, release_called) intervals overlap."""
    overlaps = 0
    for holds in by_device(cycles).values():
        latest_end = -float("inf")
        for h in holds:
            if h.acquired < latest_end:
                overlaps += 1
            latest_end = max(latest_end, h.release_called)
    return overlaps


def handoff_gaps(cycles: list[Cycle], start: float, end: float) -> list[float]:
    """For each release called in [start, end) while some process was waiting (asked before it,
    acquired after it), the time until the device's next holder had it."""
    # Waiting intervals [asked, acquired), to ask "was anyone waiting at t?" by bisection: someone was
    # iff some interval that began before t ends after t.
    waits = sorted((c.asked, c.acquired) for c in cycles)
    starts = [w[0] for w in waits]
    max_end_prefix: list[float] = []
    best = -float("inf")
    for _, acquired in waits:
        best = max(best, acquired)
        max_end_prefix.append(best)

    def someone_waiting(t: float) -> bool:
        i = bisect.bisect_left(starts, t)  # intervals that began strictly before t
        return i > 0 and max_end_prefix[i - 1] > t

    gaps = []
    for holds in by_device(cycles).values():
        for prev, nxt in zip(holds, holds[1:]):
            if start <= prev.release_called < end and someone_waiting(prev.release_called):
                gaps.append(nxt.acquired - prev.release_called)
    return gaps


def held_fraction(cycles: list[Cycle], devices: int, start: float, end: float) -> float:
    held = sum(max(0.0, min(c.release_called, end) - max(c.acquired, start)) for c in cycles)
    return held / (devices * (end - start))


# -- running a phase --------------------------------------------------------------------------------

def run_phase(name: str, url: str, procs: int, args: argparse.Namespace, locks: Path,
              profile: Path | None) -> tuple[list[Cycle], int, float, float]:
    """Start ``procs`` workers, release them at once, collect their cycles. Returns the cycles, the
    flock conflicts, and the measured window (monotonic start, end)."""
    workers = []
    for i in range(procs):
        spec = {"url": url, "hold_s": args.hold_ms / 1000, "locks": str(locks),
                "flush_after": name == "postgres-flush",
                "poll_s": None if args.poll_ms is None else args.poll_ms / 1000,
                "profile": str(profile) if profile is not None and i == 0 else None}
        workers.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for w in workers:  # every process imported and connected: start them together
        assert w.stdout is not None
        if w.stdout.readline().strip() != "ready":
            raise SystemExit(f"a worker failed to start ({w.wait()})")
    go_at = time.monotonic() + 0.2
    stop_at = go_at + args.seconds
    for w in workers:
        assert w.stdin is not None
        w.stdin.write(f"{go_at} {stop_at}\n")
        w.stdin.close()
    cycles: list[Cycle] = []
    conflicts = 0
    for w in workers:
        assert w.stdout is not None
        out = w.stdout.read()
        if w.wait() != 0:
            raise SystemExit(f"a worker failed ({w.returncode})")
        result = json.loads(out)
        cycles += [Cycle(*c) for c in result["cycles"]]
        conflicts += result["lock_conflicts"]
    return cycles, conflicts, go_at + args.warmup, stop_at


def run_backend(name: str, url: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    from farm.device.probe import DeviceInfo
    from farm.pool import Pool

    def sync() -> None:
        # Before each phase: devices not seen within the pool's liveness bound (120 s) go offline.
        with Pool.open(url) as pool:
            pool.sync([DeviceInfo(serial=f"bench{i:02d}", server="127.0.0.1:15037", soc="SM8650",
                                  htp_arch="v75", virtual=True) for i in range(args.devices)])

    sync()
    locks = tmp / f"locks-{name}"
    locks.mkdir()
    prof = Path(args.profile) if args.profile else None
    if prof is not None:
        prof.mkdir(parents=True, exist_ok=True)
    cycles, conflicts, start, end = run_phase(name, url, args.procs, args, locks,
                                              prof / f"{name}-contended.prof" if prof else None)
    gaps = handoff_gaps(cycles, start, end)
    done = [c for c in cycles if start <= c.release_called < end]
    sync()
    quiet, quiet_conflicts, qstart, qend = run_phase(
        name, url, args.devices, args, locks, prof / f"{name}-uncontended.prof" if prof else None)
    acquire = [c.acquired - c.asked for c in quiet if qstart <= c.asked < qend]
    return {"handoff_p50_ms": statistics.median(gaps) * 1000 if gaps else float("nan"),
            "handoff_p99_ms": percentile(gaps, 0.99) * 1000, "handoffs": len(gaps),
            "utilisation": held_fraction(cycles, args.devices, start, end),
            "cycles_per_s": len(done) / (end - start),
            "double_holds": double_holds(cycles) + double_holds(quiet),
            "lock_conflicts": conflicts + quiet_conflicts,
            "uncontended_p50_ms": statistics.median(acquire) * 1000 if acquire else float("nan"),
            "uncontended_p99_ms": percentile(acquire, 0.99) * 1000, "acquires": len(acquire)}


def postgres_url(base: str, schema: str) -> str:
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote(f'-csearch_path={schema}', safe='')}"


def main() -> int:
    if "--scale" in sys.argv[1:]:  # the pool at farm scale: bench/bench_pool_scale.py
        sys.path.insert(0, str(REPO / "bench"))
        import bench_pool_scale

        return bench_pool_scale.main()
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=32, help="contending processes")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds not measured")
    parser.add_argument("--hold-ms", type=float, default=100.0, help="time each lease is held")
    parser.add_argument("--poll-ms", type=float, default=None,
                        help="waiters' poll interval (default: the pool's)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--profile", metavar="DIR", help="cProfile worker 0 of each phase into DIR")
    args = parser.parse_args()

    results: dict[str, dict[str, float]] = {}
    backends = args.backends.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmpdir:
        tmp = Path(tmpdir)
        if "sqlite" in backends:
            results["sqlite"] = run_backend("sqlite", f"sqlite:///{tmp}/pool.db", args, tmp)
        for name in (b for b in backends if b.startswith("postgres")):
            import psycopg

            base = os.environ.get("PTEFARM_TEST_PG_URL") or DEFAULT_PG_URL
            schema = f"ptefarm_bench_{secrets.token_hex(4)}"
            with psycopg.connect(base, autocommit=True) as admin:
                admin.execute(f'CREATE SCHEMA "{schema}"')
                try:
                    results[name] = run_backend(name, postgres_url(base, schema), args, tmp)
                finally:
                    admin.execute(f'DROP SCHEMA "{schema}" CASCADE')

    print(f"{args.procs} processes on {args.devices} devices, hold {args.hold_ms:g} ms, "
          f"{args.seconds:g} s per phase ({args.warmup:g} s warm-up), uncontended: {args.devices} "
          f"processes, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'backend':<9} {'handoff p50':>11} {'p99 ms':>7} {'n':>5} {'util %':>7} {'cycles/s':>9} "
          f"{'double':>6} {'flock':>5} {'uncont p50':>10} {'p99 ms':>7} {'n':>5}")
    met, total = 0, 0
    for name, r in results.items():
        print(f"{name:<9} {r['handoff_p50_ms']:>11.2f} {r['handoff_p99_ms']:>7.2f} {r['handoffs']:>5} "
              f"{100 * r['utilisation']:>7.1f} {r['cycles_per_s']:>9.1f} {r['double_holds']:>6} "
              f"{r['lock_conflicts']:>5} {r['uncontended_p50_ms']:>10.2f} "
              f"{r['uncontended_p99_ms']:>7.2f} {r['acquires']:>5}")
        checks = [r["handoff_p99_ms"] < TARGETS["handoff_p99_ms"],
                  r["utilisation"] >= TARGETS["utilisation"],
                  r["uncontended_p99_ms"] < TARGETS["uncontended_p99_ms"].get(name, 10.0),
                  r["double_holds"] == 0 and r["lock_conflicts"] == 0]
        if name in TARGETS["uncontended_p99_ms"]:  # not the comparison variants
            met, total = met + sum(checks), total + len(checks)
    ideal = args.devices / (args.hold_ms / 1000)
    parts = [f"{name}: handoff p99 {r['handoff_p99_ms']:.1f} ms, util {100 * r['utilisation']:.1f} %, "
             f"cycles/s x{r['cycles_per_s'] / ideal:.3f} of ideal, uncontended p99 "
             f"{r['uncontended_p99_ms']:.1f} ms" for name, r in results.items()]
    if "sqlite" in results and "postgres" in results:
        s, p = results["sqlite"], results["postgres"]
        parts.append(f"postgres/sqlite handoff p99 x{p['handoff_p99_ms'] / s['handoff_p99_ms']:.2f}, "
                     f"uncontended p99 x{p['uncontended_p99_ms'] / s['uncontended_p99_ms']:.2f}")
    if "postgres-flush" in results and "postgres" in results:
        p, o = results["postgres"], results["postgres-flush"]
        parts.append(f"postgres/postgres-flush handoff p99 x{p['handoff_p99_ms'] / o['handoff_p99_ms']:.2f}, "
                     f"util x{p['utilisation'] / o['utilisation']:.2f}")
    doubles = sum(r["double_holds"] + r["lock_conflicts"] for r in results.values())
    print(f"summary: {'; '.join(parts)}; double holds {doubles}; targets met {met}/{total}")
    return 0 if met == total else 1


if __name__ == "__main__":
    sys.exit(main())
