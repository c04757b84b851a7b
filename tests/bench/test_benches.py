"""Every benchmark under bench/ runs from a fresh checkout and ends with its summary line.

Each runs here with the smallest arguments that still take every code path (a few MiB, a few tests,
a second of pool contention). Nothing about the figures is asserted: these machines are shared and
noisy, and the benchmarks' own targets are for a full run (README, "Performance"). What is asserted:
the script finishes, prints a table, ends with one ``summary:`` line, and raises nothing. Exit 1 is
allowed only where a script uses it to say a target was missed (a figure, never a crash).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.config import DEFAULT_CHUNK_MIN_BYTES

REPO = Path(__file__).resolve().parents[2]

# script -> (arguments, exit codes meaning "ran")
BENCHES = {
    # At the chunk threshold, so the chunked cold deploy runs; twice, so the second repeat proves each
    # cold deploy starts from an empty chunk store (a store left over pushes nothing: exit 1).
    "bench_push.py": (["--size-mb", str(DEFAULT_CHUNK_MIN_BYTES >> 20), "--repeat", "2"], {0}),
    "bench_deploy.py": (["--pte-mb", "6", "--lib-mb", "2,1", "--rounds", "1"], {0}),
    "bench_delta_deploy.py": (["--synthetic", "4", "--rounds", "1", "--mbps", "20"], {0, 1}),
    "bench_upstream_flow.py": (["--runs", "2", "--padding-mb", "4"], {0}),
    "bench_gate.py": (["--trials", "8"], {0, 1}),  # 1: a target missed (8 trials decide nothing)
    "bench_orchestration.py": (["--tests", "4", "--sleep", "0.2", "--devices", "1,2"], {0}),
    "bench_pool.py": (["--procs", "4", "--devices", "2", "--seconds", "1.5", "--warmup", "0.3",
                       "--hold-ms", "20"], {0, 1}),  # 1: a target missed
    "bench_pool_scale.py": (["--devices", "120", "--servers", "4", "--procs", "2", "--simulated", "30",
                             "--seconds", "2", "--warmup", "0.5", "--hold-ms", "200"], {0, 1}),
    "bench_runner_startup.py": (["--repeats", "1"], {0}),
    "bench_runner_tokens.py": (["--configs", "tiny", "--modes", "kv", "--repeats", "1",
                                "--tokens", "8"], {0, 1}),  # 1: per-token overhead over target
    "bench_updaters.py": (["--configs", "tiny", "--repeats", "1"], {0}),
}


# script -> rows its table must have (a path the small arguments must still take)
ROWS = {"bench_push.py": ["farm deploy (whole file, cold)", "farm deploy (chunked, cold)"]}


def test_every_benchmark_is_covered():
    assert sorted(p.name for p in (REPO / "bench").glob("bench_*.py")) == sorted(BENCHES)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", sorted(BENCHES))
def test_benchmark_runs_and_ends_with_its_summary(script, tmp_path):
    args, ok_codes = BENCHES[script]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # whatever a benchmark leaves behind stays here
    if script.startswith("bench_pool") and not os.environ.get("PTEFARM_TEST_PG_URL"):
        args = [*args, "--backends", "sqlite"]
    proc = subprocess.run([sys.executable, "-P", str(REPO / "bench" / script), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=580)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode in ok_codes, f"{script} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert lines and lines[-1].startswith("summary: "), proc.stdout
    assert len(lines) >= 3, proc.stdout  # a table came first
    for row in ROWS.get(script, []):
        assert any(line.lstrip().startswith(row + " ") for line in lines), (row, proc.stdout)
