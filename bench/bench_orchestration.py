"""Orchestration overhead of the pytest plugin: 48 tests that each wait on a device, on 1, 2, 4 and 8
virtual devices, against the ideal makespan.

    python bench/bench_orchestration.py [--tests 48] [--sleep 2] [--devices 1,2,4,8]

Each test takes the ``device`` fixture (a lease from the pool, heartbeat, fenced device) and runs
``sleep S`` on the device: the device waits, the host does nothing, as while a phone works. The test
file is written to a temp dir; pytest runs in a subprocess with ``-n D`` (one xdist worker per device)
against D pre-started virtual devices and a fresh SQLite pool (a farm.toml, as tests/test_plugin.py
does), and its whole wall time is measured: interpreter and worker start-up, collection, leases,
reports. Ideal makespan: total device time / D, rounded up by the longest test, i.e.
ceil(tests / D) * S. A run of the same tests with ``sleep 0`` on one device gives the overhead that is
paid per test (lease acquire/release, heartbeat, fence, reporting) apart from the fixed start-up.
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = {1: 1.05, 8: 1.10}

TEST_FILE = '''
import pytest

@pytest.mark.parametrize("i", range({tests}))
def test_device_work(device, i):
    result = device.shell("sleep {sleep}", timeout=60)
    assert result.exit_code == 0
'''


def run_once(tmp: Path, devices: int, tests: int, sleep: float, bundle: Path,
             extra: list[str]) -> float:
    """Wall seconds of one pytest run of ``tests`` tests on ``devices`` fresh virtual devices."""
    from farm.virtual import VirtualDeviceSpec, VirtualFarm
    from tests.plugin_helpers import explain, farm_toml, run_pytest

    work = Path(tempfile.mkdtemp(prefix=f"d{devices}-", dir=tmp))
    (work / "test_device_work.py").write_text(TEST_FILE.format(tests=tests, sleep=sleep))
    with VirtualFarm(home=work / "farm") as vf:
        vf.up([VirtualDeviceSpec(soc="SM8650") for _ in range(devices)])
        config = farm_toml(work / "farm.toml", vf.adb_server.port, f"sqlite:///{work / 'pool.db'}")
        started = time.perf_counter()
        proc = run_pytest(["test_device_work.py", "-n", str(devices), "--farm-config", str(config),
                           "--farm-bundle", str(bundle), "--farm-out", str(work / "out"), *extra],
                          cwd=work, timeout=3600)
        wall = time.perf_counter() - started
    if proc.returncode != 0 or f"{tests} passed" not in proc.stdout:
        raise SystemExit(f"pytest on {devices} devices failed:\n{explain(proc)}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=48)
    parser.add_argument("--sleep", type=float, default=2.0)
    parser.add_argument("--devices", default="1,2,4,8")
    parser.add_argument("--pytest-args", default="",
                        help="extra pytest arguments, e.g. '-p no:hypothesispytest -p no:hydra_pytest' "
                             "to measure without the third-party plugins the environment installs")
    args = parser.parse_args()
    extra = args.pytest_args.split()
    from tests.device_helpers import make_qnn_bundle

    counts = [int(d) for d in args.devices.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-orchestration-", dir="/tmp"))
    try:
        bundle = make_qnn_bundle(tmp / "bundle", name="orchestration")
        idle = run_once(tmp, 1, args.tests, 0, bundle, extra)
        rows = []
        for d in counts:
            wall = run_once(tmp, d, args.tests, args.sleep, bundle, extra)
            ideal = math.ceil(args.tests / d) * args.sleep
            rows.append((d, wall, ideal))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{args.tests} tests of `sleep {args.sleep:g}` on the device, through the pytest plugin "
          f"(-n D, one worker per device){' ' + args.pytest_args if extra else ''}")
    print(f"  {'devices':>7} {'wall s':>8} {'ideal s':>8} {'ratio':>6} {'overhead s':>11} "
          f"{'per test on a device s':>23}")
    for d, wall, ideal in rows:
        per_slot = (wall - ideal) / math.ceil(args.tests / d)
        print(f"  {d:>7} {wall:8.2f} {ideal:8.2f} {wall / ideal:6.3f} {wall - ideal:11.2f} "
              f"{per_slot:23.3f}")
    print(f"  same {args.tests} tests with `sleep 0` on 1 device: {idle:.2f} s "
          f"({idle / args.tests * 1000:.0f} ms a test, start-up included)")
    ratios = ", ".join(f"{d} dev {wall / ideal:.3f}x" + (f" (target <= {TARGETS[d]})" if d in TARGETS
                                                         else "") for d, wall, ideal in rows)
    print(f"summary: wall / ideal makespan: {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
