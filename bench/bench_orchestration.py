"""Orchestration overhead of the pytest plugin: 48 tests that each wait on a device, on 1, 2, 4 and 8
virtual devices, against the ideal makespan.

    python bench/bench_orchestration.py [--tests 48] [--sleep 2] [--devices 1,2,4,8] [--rounds 3]
                                        [--before REV] [--target KEY=LIMIT]

Each test takes the ``device`` fixture (a lease from the pool, heartbeat, fenced device) and runs
``sleep S`` on the device: the device waits, the host does nothing, as while a phone works. The test
file is written to a temp dir; pytest runs in a subprocess with ``-n D`` (one xdist worker per device)
against D pre-started virtual devices and a fresh SQLite pool (a farm.toml, as tests/fixtures/test_plugin.py
does), and its whole wall time is measured: interpreter and worker start-up, collection, leases,
reports. pytest runs as ``farm qualify`` runs it: with the auto-loaded plugins the farm does not use
blocked (farm.cli.qualify.UNRELATED_PLUGINS). Ideal makespan: total device time / D, rounded up by the
longest test, i.e. ceil(tests / D) * S. A run of the same tests with ``sleep 0`` on one device gives the
overhead that is paid per test (lease acquire/release, heartbeat, fence, reporting) apart from the
fixed start-up.

Beside each, the floor this host sets (``--no-baseline`` leaves it out): the same number of tests
sleeping S seconds in the test itself, run by bare pytest-xdist with D workers and the ptefarm plugin
not loaded, no devices. What the farm adds is the difference between the two; what bare xdist itself
costs (a Python interpreter, pytest and execnet per worker, on the host's cores) no plugin can remove.

``--unforked`` adds this checkout with its xdist workers started as fresh interpreters
(``PTEFARM_FORK_WORKERS=0``) instead of forked from the plugin's worker zygote, side by side;
``--late-zygote`` adds it with the zygote started as the run configures (``PTEFARM_FORK_WORKERS=late``)
instead of as pytest imports the plugin.
``--rounds N`` (3) runs every configuration N times, interleaved, and reports each one's median wall;
each ratio is the median of the rounds' ratios (farm / bare xdist within a round: they share its load)
with its spread (min-max) over the rounds.

Targets: wall / ideal makespan <= 1.05 on 1 device and <= 1.10 on 8 (the median over rounds, this
checkout's default run), judged at the device counts measured; one line each says met or MISSED
(``--target KEY=LIMIT`` sets one for a run) and the bench exits 1 when one is missed.

``--before REV`` measures the plugin (``fixtures/``) of git revision REV beside this checkout's, each
device count run before then after (the host's load is shared by both), and "before" with pytest's
plugins as the environment auto-loads them, as REV's ``farm qualify`` ran it. Only the plugin is
taken from REV; ``farm`` is this checkout's.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchlib import Spread, Target, add_target_option, judge, print_verdicts, targets_met  # noqa: E402
from benchlib import with_overrides  # noqa: E402

# devices -> the target on wall / ideal makespan there
TARGETS = {d: Target(f"wall_ideal_{d}", f"wall / ideal makespan on {d} device{'s' * (d > 1)}", "<=", limit,
                     "x")
           for d, limit in ((1, 1.05), (8, 1.10))}
# This checkout's other ways of starting xdist workers (PTEFARM_FORK_WORKERS), side by side with the
# default: label -> (the switch's value, what the row is, what the summary calls it).
WORKER_STARTS = {
    "unforked": ("0", "workers started as fresh interpreters", "fresh-interpreter workers"),
    "late": ("late", "worker zygote started as the run configures", "zygote started late"),
}

TEST_FILE = '''
import pytest

@pytest.mark.parametrize("i", range({tests}))
def test_device_work(device, i):
    result = device.shell("sleep {sleep}", timeout=60)
    assert result.exit_code == 0
'''

BARE_TEST_FILE = '''
import time

import pytest

@pytest.mark.parametrize("i", range({tests}))
def test_host_sleep(i):
    time.sleep({sleep})
'''


def run_once(tmp: Path, devices: int, tests: int, sleep: float, bundle: Path,
             extra: list[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of one pytest run of ``tests`` tests on ``devices`` fresh virtual devices."""
    from farm.virtual import VirtualDeviceSpec, VirtualFarm
    from tests.support.plugin import explain, farm_toml, run_pytest

    work = Path(tempfile.mkdtemp(prefix=f"d{devices}-", dir=tmp))
    (work / "test_device_work.py").write_text(TEST_FILE.format(tests=tests, sleep=sleep))
    with VirtualFarm(home=work / "farm") as vf:
        vf.up([VirtualDeviceSpec(soc="SM8650") for _ in range(devices)])
        config = farm_toml(work / "farm.toml", vf.adb_server.port, f"sqlite:///{work / 'pool.db'}")
        started = time.perf_counter()
        proc = run_pytest(["test_device_work.py", "-n", str(devices), "--farm-config", str(config),
                           "--farm-bundle", str(bundle), "--farm-out", str(work / "out"), *extra],
                          cwd=work, env=env, timeout=3600)
        wall = time.perf_counter() - started
    if proc.returncode != 0 or f"{tests} passed" not in proc.stdout:
        raise SystemExit(f"pytest on {devices} devices failed:\n{explain(proc)}")
    return wall


def run_bare(tmp: Path, workers: int, tests: int, sleep: float, extra: list[str]) -> float:
    """Wall seconds of the same tests sleeping on the host, under bare pytest-xdist (no ptefarm)."""
    from tests.support.plugin import explain, run_pytest

    work = Path(tempfile.mkdtemp(prefix=f"bare{workers}-", dir=tmp))
    (work / "test_host_sleep.py").write_text(BARE_TEST_FILE.format(tests=tests, sleep=sleep))
    started = time.perf_counter()
    proc = run_pytest(["test_host_sleep.py", "-n", str(workers), "-p", "no:ptefarm", *extra],
                      cwd=work, timeout=3600)
    wall = time.perf_counter() - started
    if proc.returncode != 0 or f"{tests} passed" not in proc.stdout:
        raise SystemExit(f"bare pytest-xdist with {workers} workers failed:\n{explain(proc)}")
    return wall


@dataclass
class Variant:
    label: str
    extra: list[str]  # pytest arguments
    env: dict[str, str] | None = None  # PYTHONPATH with another revision's plugin
    idle: float = 0.0
    rows: list[Row] = field(default_factory=list)


@dataclass
class Row:
    devices: int
    walls: list[float]  # one a round
    ideal: float
    bares: list[float] = field(default_factory=list)  # bare xdist's walls, the same rounds

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    def ratio(self) -> Spread:
        return Spread.of(w / self.ideal for w in self.walls)

    def over_bare(self) -> Spread:
        return Spread.of(w / b for w, b in zip(self.walls, self.bares))


def plugin_of(rev: str, into: Path) -> dict[str, str]:
    """The environment a pytest run needs to load the plugin of git revision ``rev``: its fixtures/
    exported as ``ptefarm_fixtures`` first on PYTHONPATH (ahead of the editable install's finder)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "fixtures"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "fixtures").rename(into / "ptefarm_fixtures")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(into), os.environ.get("PYTHONPATH")]))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=48)
    parser.add_argument("--sleep", type=float, default=2.0)
    parser.add_argument("--devices", default="1,2,4,8")
    parser.add_argument("--pytest-args", default="",
                        help="extra pytest arguments of every run, e.g. '-p hypothesispytest' to "
                             "measure with a plugin the farm blocks")
    parser.add_argument("--before", metavar="REV", default=None,
                        help="also measure the plugin of this git revision (with pytest's default "
                             "plugins), side by side")
    parser.add_argument("--unforked", action="store_true",
                        help="also this checkout with fresh-interpreter workers (PTEFARM_FORK_WORKERS=0)")
    parser.add_argument("--late-zygote", action="store_true",
                        help="also this checkout with the worker zygote started as the run configures "
                             "(PTEFARM_FORK_WORKERS=late)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of every configuration, interleaved; medians and their spread "
                             "(min-max) are reported")
    parser.add_argument("--no-baseline", action="store_true",
                        help="leave out bare pytest-xdist (the same sleeps on the host, no farm)")
    add_target_option(parser, TARGETS.values())
    args = parser.parse_args()
    targets = with_overrides(list(TARGETS.values()), args.target)
    from farm.cli.qualify import unrelated_plugin_args
    from tests.support.devices import make_qnn_bundle

    counts = [int(d) for d in args.devices.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-orchestration-", dir="/tmp"))
    try:
        variants = [Variant("after" if args.before or args.unforked or args.late_zygote else "",
                            [*unrelated_plugin_args(), *args.pytest_args.split()])]
        for label, asked in (("late", args.late_zygote), ("unforked", args.unforked)):
            if asked:
                switch = WORKER_STARTS[label][0]
                variants.insert(0, Variant(label, variants[0].extra, {"PTEFARM_FORK_WORKERS": switch}))
        if args.before:
            variants.insert(0, Variant("before", args.pytest_args.split(),
                                       plugin_of(args.before, tmp / "before")))
        bundle = make_qnn_bundle(tmp / "bundle", name="orchestration")
        for v in variants:
            v.idle = run_once(tmp, 1, args.tests, 0, bundle, v.extra, v.env)
        bare: dict[int, float] = {}
        for d in counts:  # variants one after the other, round by round: they share the host's load
            walls: dict[str, list[float]] = {v.label: [] for v in variants}
            bares: list[float] = []
            for _ in range(args.rounds):
                for v in variants:
                    walls[v.label].append(run_once(tmp, d, args.tests, args.sleep, bundle, v.extra,
                                                   v.env))
                if not args.no_baseline:
                    bares.append(run_bare(tmp, d, args.tests, args.sleep, variants[-1].extra))
            for v in variants:
                v.rows.append(Row(d, walls[v.label], math.ceil(args.tests / d) * args.sleep, bares))
            if bares:
                bare[d] = statistics.median(bares)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{args.tests} tests of `sleep {args.sleep:g}` on the device, through the pytest plugin "
          f"(-n D, one worker per device); median wall of {args.rounds} round(s), ratios median "
          f"(min-max)")
    for v in variants:
        if v.label == "before":
            what = f"the plugin of {args.before}, pytest's plugins as installed"
        elif v.label in WORKER_STARTS:
            switch, row, _ = WORKER_STARTS[v.label]
            what = f"this checkout, {row} (PTEFARM_FORK_WORKERS={switch})"
        else:
            what = "this checkout, with the plugins farm qualify blocks"
        print(f"  {v.label or 'run'}: {what}: {shlex.join(v.extra) or 'no extra pytest arguments'}")
    print(f"  {'variant':>7} {'devices':>7} {'wall s':>8} {'ideal s':>8} {'ratio (min-max)':>21} "
          f"{'overhead s':>11} {'per test on a device s':>23}")
    for i, d in enumerate(counts):
        for v in variants:
            r = v.rows[i]
            per_slot = (r.wall - r.ideal) / math.ceil(args.tests / d)
            print(f"  {v.label or '-':>7} {d:>7} {r.wall:8.2f} {r.ideal:8.2f} {r.ratio().format('.3f'):>21} "
                  f"{r.wall - r.ideal:11.2f} {per_slot:23.3f}")
        if d in bare:
            r = variants[-1].rows[i]
            own = Spread.of(b / r.ideal for b in r.bares)
            print(f"  {'xdist':>7} {d:>7} {bare[d]:8.2f} {r.ideal:8.2f} {own.format('.3f'):>21} "
                  f"{bare[d] - r.ideal:11.2f} {'(bare, no farm)':>23}")
    for v in variants:
        print(f"  {v.label + ': ' if v.label else ''}same {args.tests} tests with `sleep 0` on 1 "
              f"device: {v.idle:.2f} s ({v.idle / args.tests * 1000:.0f} ms a test, start-up included)")

    def ratios(v: Variant) -> str:
        return ", ".join(f"{r.devices} dev x{r.ratio().format('.3f')}" for r in v.rows)

    after = variants[-1]
    before = f"; before ({args.before}): {ratios(variants[0])}" if args.before else ""
    others = [(v, WORKER_STARTS[v.label][2]) for v in variants if v.label in WORKER_STARTS]
    before += "".join(f"; {called}: {ratios(v)}" for v, called in others)
    floor = ""
    if bare:
        floor = ("; bare pytest-xdist (same sleeps on the host, no farm): "
                 + ", ".join(f"{r.devices} workers x{Spread.of(b / r.ideal for b in r.bares).format('.3f')}"
                             for r in after.rows)
                 + "; farm / bare xdist wall: "
                 + ", ".join(f"{r.devices} dev x{r.over_bare().format('.3f')}" for r in after.rows)
                 + "".join(f" ({called}: " + ", ".join(f"{r.devices} dev x{r.over_bare().format('.3f')}"
                                                       for r in v.rows)
                           + ")" for v, called in others))
    # Judged on this checkout's default run; the other variants are there to be compared with it.
    verdicts = judge((targets[TARGETS[r.devices].key], r.ratio().median) for r in after.rows
                     if r.devices in TARGETS)
    code = print_verdicts(verdicts)
    judged = targets_met(verdicts) if verdicts else (
        f"no target at these device counts (targets at {' and '.join(map(str, TARGETS))} devices)")
    print(f"summary: wall / ideal makespan, median (min-max) of {args.rounds} round(s): "
          f"{ratios(after)}{before}{floor}; {judged}")
    return code


if __name__ == "__main__":
    sys.exit(main())
