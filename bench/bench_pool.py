#!/usr/bin/env python3
"""Pool throughput under contention: N processes lease and release M devices as fast as they can.

    python bench/bench_pool.py                      # 32 processes, 8 devices, SQLite and PostgreSQL
    python bench/bench_pool.py --procs 16 --seconds 5 --hold-ms 10 --backends sqlite

For each backend, in one run, on the same machine: acquire latency (time from asking to holding,
including waiting in the queue) median and p99, and acquire/release cycles per second over all
processes. The PostgreSQL pool lives in a fresh schema of $PTEFARM_TEST_PG_URL (or the default
postgresql://postgres@127.0.0.1:5432/test), dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def worker(url: str, go_at: float, seconds: float, hold_s: float, poll_s: float) -> None:
    """One contending process: prints its acquire latencies (seconds) as one JSON line."""
    from farm.pool import Holder, LeaseRequest, Pool

    latencies = []
    cycles = 0
    with Pool.open(url, poll_s=poll_s) as pool:
        holder = Holder.current(purpose="bench")
        request = LeaseRequest()
        time.sleep(max(0.0, go_at - time.time()))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            lease = pool.acquire(request, holder, ttl_s=60, timeout_s=120)
            latencies.append(time.perf_counter() - t0)
            if hold_s:
                time.sleep(hold_s)
            pool.release(lease.token)
            cycles += 1
    print(json.dumps({"latencies": latencies, "cycles": cycles}))


def run_backend(name: str, url: str, args: argparse.Namespace) -> dict[str, float]:
    from farm.pool import Pool

    with Pool.open(url) as pool:
        pool.sync([{"serial": f"bench{i:02d}", "server": "127.0.0.1:15037", "soc": "SM8650",
                    "htp_arch": "v75", "virtual": True} for i in range(args.devices)])
    go_at = time.time() + 2.0 + 0.1 * args.procs  # every process imported and connected by then
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", url, str(go_at), str(args.seconds),
                               str(args.hold_ms / 1000), str(args.poll_ms / 1000)],
                              stdout=subprocess.PIPE, text=True) for _ in range(args.procs)]
    latencies: list[float] = []
    cycles = 0
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{name}: a worker failed ({p.returncode})")
        result = json.loads(out)
        latencies += result["latencies"]
        cycles += result["cycles"]
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    return {"median_ms": statistics.median(latencies) * 1000, "p99_ms": p99 * 1000,
            "cycles_per_s": cycles / args.seconds, "cycles": cycles}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        url, go_at, seconds, hold_s, poll_s = sys.argv[2:7]
        worker(url, float(go_at), float(seconds), float(hold_s), float(poll_s))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=32)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--hold-ms", type=float, default=0.0, help="time each lease is held")
    parser.add_argument("--poll-ms", type=float, default=50.0, help="waiter poll interval")
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()

    results: dict[str, dict[str, float]] = {}
    backends = args.backends.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
        if "sqlite" in backends:
            results["sqlite"] = run_backend("sqlite", f"sqlite:///{tmp}/pool.db", args)
        if "postgres" in backends:
            import psycopg

            base = os.environ.get("PTEFARM_TEST_PG_URL") or DEFAULT_PG_URL
            schema = f"ptefarm_bench_{secrets.token_hex(4)}"
            with psycopg.connect(base, autocommit=True) as admin:
                admin.execute(f'CREATE SCHEMA "{schema}"')
                try:
                    sep = "&" if "?" in base else "?"
                    url = f"{base}{sep}options={quote(f'-csearch_path={schema}', safe='')}"
                    results["postgres"] = run_backend("postgres", url, args)
                finally:
                    admin.execute(f'DROP SCHEMA "{schema}" CASCADE')

    print(f"{args.procs} processes, {args.devices} devices, {args.seconds:g}s per backend, "
          f"hold {args.hold_ms:g} ms, poll {args.poll_ms:g} ms, {os.cpu_count()} CPUs")
    print(f"{'backend':<10} {'median ms':>10} {'p99 ms':>10} {'cycles/s':>10} {'cycles':>8}")
    for name, r in results.items():
        print(f"{name:<10} {r['median_ms']:>10.1f} {r['p99_ms']:>10.1f} {r['cycles_per_s']:>10.1f} "
              f"{r['cycles']:>8.0f}")
    if len(results) == 2:
        s, p = results["sqlite"], results["postgres"]
        print(f"postgres/sqlite: median latency x{p['median_ms'] / s['median_ms']:.2f}, "
              f"p99 x{p['p99_ms'] / s['p99_ms']:.2f}, "
              f"throughput x{p['cycles_per_s'] / s['cycles_per_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
