"""A holder process that died: its leases end at once when someone who saw it die says so (the
pytest-xdist controller for a crashed worker), instead of keeping the device idle for their TTL."""

from __future__ import annotations

import os
import socket

from farm.pool import Holder, LeaseRequest, Pool
from farm.vocab import EventKind
from tests.support.plugin import explain, results_json, run_pytest
from tests.support.pool import fake_device


def test_a_dead_processs_leases_end_and_nobody_elses(pool: Pool):
    pool.sync([fake_device("dev0"), fake_device("dev1")])
    host = socket.gethostname()
    dead = Holder(user="ci", host=host, pid=999_999_001)
    other_host = Holder(user="ci", host="elsewhere", pid=999_999_001)
    lost = pool.acquire(LeaseRequest(), dead, ttl_s=600)
    kept = pool.acquire(LeaseRequest(), other_host, ttl_s=600)

    assert pool.release_holder(host, 999_999_001, "worker gw0 crashed") == [lost.serial]

    status = {d.device.serial: d for d in pool.status().devices}
    assert status[lost.serial].lease is None and status[lost.serial].device.state == "available"
    assert status[kept.serial].lease is not None  # same pid on another host: another process
    [ended] = [e for e in pool.history(token=lost.token) if e.kind == EventKind.RELEASED]
    assert ended.serial == lost.serial


CRASHER = """
import os, time

def _log(name, serial):
    with open(os.environ["FARM_TEST_LOG"], "a") as f:
        f.write(f"{name} {serial} {time.time()!r}\\n")

def test_crash_once(device):
    if not os.path.exists(os.environ["CRASHED_MARKER"]):
        _log("crash", device.serial)
        open(os.environ["CRASHED_MARKER"], "w").write(device.serial)
        os._exit(1)  # the xdist worker dies mid-test, holding its lease
    _log("rerun", device.serial)

def test_after(device, i):
    time.sleep(0.5)
    _log("after", device.serial)

def pytest_generate_tests(metafunc):
    if "i" in metafunc.fixturenames:
        metafunc.parametrize("i", range(6))
"""


def test_a_crashed_workers_device_is_used_again_at_once(tiny_bundle, tmp_path):
    """The lease TTL is longer than the whole run: only the controller's release can bring the
    crashed worker's device back in time for the tests after the crash."""
    (tmp_path / "test_crasher.py").write_text(CRASHER)
    config = tmp_path / "farm.toml"
    config.write_text("[pool]\nlease_ttl_s = 600\n")
    log = tmp_path / "log"
    out = tmp_path / "out"
    proc = run_pytest(["test_crasher.py", "-n", "2", "-p", "no:randomly", "--farm-virtual", "SM8650:2",
                       "--farm-config", str(config), "--farm-bundle", str(tiny_bundle),
                       "--farm-out", str(out)],
                      cwd=tmp_path, env={"CRASHED_MARKER": str(tmp_path / "crashed"),
                                         "FARM_TEST_LOG": str(log)})
    assert results_json(out)["meta"]["verdict"] == "pass", explain(proc)
    lines = [line.split() for line in log.read_text().splitlines()]
    [(_, crashed, crashed_at)] = [line for line in lines if line[0] == "crash"]
    later = [serial for name, serial, at in lines if float(at) > float(crashed_at)]
    assert crashed in later, (f"nothing ran on {crashed} after its worker crashed: {lines}"
                              + os.linesep + explain(proc))
