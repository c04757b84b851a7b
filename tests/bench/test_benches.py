"""Every benchmark under bench/ runs from a fresh checkout and ends with its summary line.

Each runs here with the smallest arguments that still take every code path (a few MiB, a few tests,
a second of pool contention). Nothing about the figures is asserted: these machines are shared and
noisy, and the benchmarks' own targets are for a full run (README, "Performance"). What is asserted:
the script finishes, prints a table, ends with one ``summary:`` line, and raises nothing. Exit 1 is
allowed only where a script uses it to say a target was missed (a figure, never a crash).

A bench that judges its targets is run with limits set by ``--target``: one that no figure can meet
(a ratio >= 1000, a time < 0) and the others ones every figure meets, so that its verdict is known
whatever the host's load: exit 1, with a ``target MISSED`` line for that target alone and ``target
met`` for the others.
"""

from __future__ import annotations

import importlib
import os
import re
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
    "bench_deploy.py": (["--pte-mb", "6", "--lib-mb", "2,1", "--rounds", "2", "--target", "farm_deploy=1000",
                         "--target", "cached=0", "--target", "redeploy=1e9", "--target", "rss=1e9"], {1}),
    "bench_delta_deploy.py": (["--synthetic", "4", "--rounds", "1", "--mbps", "20"], {0, 1}),
    "bench_upstream_flow.py": (["--runs", "2", "--padding-mb", "4"], {0}),
    "bench_gate.py": (["--trials", "8", "--rounds", "2", "--target", "false_alarms=100",
                       "--target", "power=0", "--target", "device_time=0"], {1}),
    "bench_orchestration.py": (["--tests", "4", "--sleep", "0.2", "--devices", "1,2", "--rounds", "1",
                                "--target", "wall_ideal_1=0"], {1}),
    "bench_pool.py": (["--procs", "4", "--devices", "2", "--seconds", "1.5", "--warmup", "0.3",
                       "--hold-ms", "20"], {0, 1}),  # 1: a target missed
    "bench_pool_scale.py": (["--devices", "120", "--servers", "4", "--procs", "2", "--simulated", "30",
                             "--seconds", "2", "--warmup", "0.5", "--hold-ms", "200",
                             "--target", "grant_p99=1e9", "--target", "hold_p99=0"], {1}),
    "bench_runner_startup.py": (["--repeats", "1", "--target", "first_token=0"], {1}),
    "bench_runner_tokens.py": (["--configs", "tiny", "--modes", "kv", "--repeats", "1",
                                "--tokens", "8"], {0, 1}),  # 1: per-token overhead over target
    "bench_updaters.py": (["--configs", "tiny", "--repeats", "1"], {0}),
}


# script -> rows its table must have (a path the small arguments must still take)
ROWS = {"bench_push.py": ["farm deploy (whole file, cold)", "farm deploy (chunked, cold)"]}

# script -> (the targets, by --target key, its arguments above make it miss; those they make it meet)
JUDGED = {"bench_deploy.py": ({"farm_deploy"}, {"cached", "redeploy", "rss"}),
          "bench_gate.py": ({"device_time"}, {"false_alarms", "power"}),
          "bench_orchestration.py": ({"wall_ideal_1"}, set()),  # at 1 and 2 devices, one target
          "bench_pool_scale.py": ({"hold_p99"}, {"grant_p99", "double_leases"}),
          "bench_runner_startup.py": ({"first_token"}, set())}


def run_bench(script: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # whatever a benchmark leaves behind stays here
    if script.startswith("bench_pool") and not os.environ.get("PTEFARM_TEST_PG_URL"):
        args = [*args, "--backends", "sqlite"]
    return subprocess.run([sys.executable, "-P", str(REPO / "bench" / script), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=580)


def target_keys(lines: list[str], verdict: str) -> set[str]:
    """The --target keys of the ``target <verdict>:`` lines."""
    return {re.search(r"--target (\w+)=LIMIT", line).group(1) for line in lines
            if line.startswith(f"target {verdict}: ")}


def test_every_benchmark_is_covered():
    assert sorted(p.name for p in (REPO / "bench").glob("bench_*.py")) == sorted(BENCHES)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", sorted(BENCHES))
def test_benchmark_runs_and_ends_with_its_summary(script, tmp_path):
    args, ok_codes = BENCHES[script]
    proc = run_bench(script, args, tmp_path)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode in ok_codes, f"{script} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert lines and lines[-1].startswith("summary: "), proc.stdout
    assert len(lines) >= 3, proc.stdout  # a table came first
    for row in ROWS.get(script, []):
        assert any(line.lstrip().startswith(row + " ") for line in lines), (row, proc.stdout)
    if script in JUDGED:
        missed, met = JUDGED[script]
        assert (target_keys(lines, "MISSED"), target_keys(lines, "met")) == (missed, met), proc.stdout
        assert "MISSED: " in lines[-1], lines[-1]  # the summary names it too
    if script == "bench_pool_scale.py":  # the hold p99 counts the simulated waiters' writes too
        for line in lines:
            if m := re.search(r"lock hold of the (\d+) writes in the window: the measured processes' (\d+)",
                              line):
                assert int(m.group(1)) > int(m.group(2)), line


@pytest.mark.timeout(300)
def test_gate_without_a_fixed_n_meeting_the_power_target_says_so_and_exits_2(tmp_path):
    proc = run_bench("bench_gate.py", ["--trials", "8", "--rounds", "1", "--target", "power=101"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no fixed N of the grid meets the stated power target" in proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines[-1].startswith("summary: ") and "NO fixed N" in lines[-1], proc.stdout
    assert not any(line.startswith("fixed-N A/B") for line in lines), proc.stdout  # nothing to show


# -- the benches' own logic, without measuring anything -------------------------------------------------

@pytest.fixture
def bench_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    return importlib.import_module("benchlib"), importlib.import_module("bench_gate")


def test_gate_compares_with_the_smallest_n_meeting_the_stated_power_target(bench_modules):
    _, gate = bench_modules
    target = gate.with_overrides(gate.TARGETS, [])["power"]
    assert (target.op, target.limit, gate.POWER_EFFECT) == (">=", 95.0, 0.05)  # what the bench states

    def powers():  # N=8 meets 95 % at 5 %; an equal-power rule would have gone on to N=10
        yield from [(4, 70.0), (6, 90.0), (8, 98.0)]
        raise AssertionError("an N past the first that qualifies was simulated")

    choice = gate.smallest_fixed_n(powers(), target)
    assert choice.n == 8 and choice.tried == ((4, 70.0), (6, 90.0), (8, 98.0))
    assert "N=8" in choice.why(target) and ">= 95 %" in choice.why(target)
    stricter = gate.with_overrides(gate.TARGETS, ["power=99"])["power"]
    assert gate.smallest_fixed_n([(8, 98.0), (10, 99.5)], stricter).n == 10


def test_gate_fails_loudly_when_no_n_meets_the_power_target(bench_modules):
    _, gate = bench_modules
    target = gate.with_overrides(gate.TARGETS, [])["power"]
    with pytest.raises(gate.NoFixedN, match=r"power at 5 % >= 95 %.*N=50 94\.9 %") as e:
        gate.smallest_fixed_n([(n, 94.9 if n == 50 else 60.0) for n in gate.FIXED_GRID], target)
    assert [n for n, _ in e.value.tried] == list(gate.FIXED_GRID)


def test_targets_judge_and_exit_codes(bench_modules, capsys):
    lib, _ = bench_modules
    at_most = lib.Target("t", "a time", "<", 0.3, " s")
    at_least = lib.Target("r", "a ratio", ">=", 0.85, "x", ".2f")
    assert lib.print_verdicts(lib.judge([(at_most, 0.2), (at_least, 0.85)])) == 0
    missed = lib.judge([(at_most, 0.3), (at_least, 0.9)])
    assert lib.print_verdicts(missed) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "target MISSED: a time 0.300 s (target < 0.3 s; --target t=LIMIT)"
    assert out[-1] == "target met: a ratio 0.90x (target >= 0.85x; --target r=LIMIT)"
    assert lib.targets_met(missed) == "targets met 1/2 (MISSED: a time < 0.3 s)"
    assert not lib.judge([(at_most, float("nan"))])[0].met  # nothing measured is not a target met
    assert lib.with_overrides([at_most], ["t=1e9"])["t"].limit == 1e9
    with pytest.raises(SystemExit, match="KEY one of t"):
        lib.with_overrides([at_most], ["nope=1"])
    with pytest.raises(SystemExit, match="not a number"):
        lib.with_overrides([at_most], ["t=fast"])


def test_spread_is_median_and_min_max(bench_modules):
    lib, _ = bench_modules
    assert lib.Spread.of([0.69, 0.66, 0.72]).format() == "0.69 (0.66-0.72)"
    assert lib.Spread.of([0.56]).format() == "0.56 (1 round)"
