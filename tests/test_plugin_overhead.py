"""What the plugin spends on a test besides the test: the device handle a worker keeps per serial (no
adb listing, no property read once it has used the device), and the guarantees that keeping it must not
weaken: a device that went away is still caught by the next test's fence claim, and any infrastructure
error makes the worker look the device up afresh. Counted in calls, never timed (bench/ times it).

Also: an ``auto`` bundle's runner dialect is recorded as detected, not as "auto"."""

from __future__ import annotations

import json

from farm.pool import Pool
from farm.virtual import VirtualDeviceSpec
from tests import runner_help
from tests.device_helpers import make_qnn_bundle
from tests.plugin_helpers import explain, farm_toml, junit_cases, results_json, run_pytest

# Counts, per test, the plugin's device look-ups and the property reads (getprop) the devices see.
COUNTING_CONFTEST = """
import json, os
import ptefarm_fixtures.plugin as plugin
from farm.device_transport import DeviceTransport

counts = {"finds": 0, "getprops": 0}
_find, _shell = plugin.find_device, DeviceTransport.shell

def find_device(*args, **kwargs):
    counts["finds"] += 1
    return _find(*args, **kwargs)

def shell(self, command, **kwargs):
    if "getprop" in command:
        counts["getprops"] += 1
    return _shell(self, command, **kwargs)

plugin.find_device = find_device
DeviceTransport.shell = shell

def pytest_runtest_logstart(nodeid, location):
    counts.update(finds=0, getprops=0)

def pytest_runtest_logfinish(nodeid, location):
    with open(os.environ["COUNTS_LOG"], "a") as f:
        f.write(json.dumps({"test": nodeid.split("::")[-1].split("[")[0], **counts}) + "\\n")
"""

FOUR_TESTS = """
from farm.errors import AdbError

def test_a(device):
    assert device.shell("echo a", timeout=30).out == "a\\n"

def test_b(device):
    raise AdbError("adb broke (injected by the test)", serial=device.serial)

def test_c(device):
    assert device.shell("echo c", timeout=30).out == "c\\n"

def test_d(device):
    assert device.shell("echo d", timeout=30).out == "d\\n"
"""


def _pool_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'pool.db'}"


def _run(tmp_path, config, bundle, *extra, env=None):
    return run_pytest(["--farm-config", str(config), "--farm-bundle", str(bundle),
                       "--farm-out", str(tmp_path / "out"), "--farm-retries", "0", *extra],
                      cwd=tmp_path, env=env)


def test_a_worker_looks_a_device_up_once_and_again_after_an_infra_error(virtual_farm, tmp_path):
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port, _pool_url(tmp_path))
    bundle = make_qnn_bundle(tmp_path / "bundle")
    (tmp_path / "conftest.py").write_text(COUNTING_CONFTEST)
    (tmp_path / "test_four.py").write_text(FOUR_TESTS)
    log = tmp_path / "counts.jsonl"
    proc = _run(tmp_path, config, bundle, "test_four.py", "-p", "no:xdist",
                env={"COUNTS_LOG": str(log)})
    assert proc.returncode == 1, explain(proc)  # pytest says a test did not pass: test_b
    counts = {c["test"]: c for c in map(json.loads, log.read_text().splitlines())}
    assert (counts["test_a"]["finds"], counts["test_a"]["getprops"]) == (1, 1)  # first lease of it
    assert counts["test_b"]["finds"] == 0  # kept (its failure's re-scan reads properties, not this)
    assert (counts["test_c"]["finds"], counts["test_c"]["getprops"]) == (1, 1)  # forgotten after b
    assert (counts["test_d"]["finds"], counts["test_d"]["getprops"]) == (0, 0)  # lease + claim only
    outcomes = {c.name: c.outcome for c in junit_cases(tmp_path / "out")}
    assert outcomes == {"test_a[SM8650]": "passed", "test_b[SM8650]": "error",
                        "test_c[SM8650]": "passed", "test_d[SM8650]": "passed"}


VANISHING = """
import os, signal

def test_first(device):
    assert device.shell("echo hi", timeout=30).exit_code == 0
    os.kill(int(os.environ["VICTIM_PID"]), signal.SIGKILL)  # the device dies between two tests

def test_second(device):
    device.shell("echo never", timeout=30)
"""


def test_a_kept_device_that_vanished_is_caught_by_the_next_claim(virtual_farm, tmp_path):
    (victim,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    # A liveness far beyond the run: only the plugin's own resync can take the device offline.
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port, _pool_url(tmp_path),
                       liveness_s=3600)
    bundle = make_qnn_bundle(tmp_path / "bundle")
    (tmp_path / "test_vanishing.py").write_text(VANISHING)
    proc = _run(tmp_path, config, bundle, "test_vanishing.py", "-p", "no:xdist",
                env={"VICTIM_PID": str(victim.pid)})
    assert proc.returncode == 1, explain(proc)
    by_name = {c.name: c for c in junit_cases(tmp_path / "out")}
    assert by_name["test_first[SM8650]"].outcome == "passed"
    second = by_name["test_second[SM8650]"]
    assert second.outcome == "error" and victim.serial in second.message, explain(proc)
    [record] = [r for r in results_json(tmp_path / "out")["results"] if "second" in r["nodeid"]]
    assert record["error_type"] == "DeviceGone" and record["error_kind"] == "infra"
    with Pool.open(_pool_url(tmp_path)) as pool:
        [status] = pool.status().devices
    assert status.device.state == "offline"  # the failure's re-scan found it gone, not blamed it


DEPLOYING = """
import pytest

@pytest.mark.parametrize("i", range(2))
def test_deployed(deployed, i):
    assert deployed is not None
"""


def test_an_auto_bundles_dialect_is_recorded_as_detected(virtual_farm, tmp_path):
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8650")])
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port, _pool_url(tmp_path))
    bundle = make_qnn_bundle(tmp_path / "bundle", name="auto-qnn", dialect="auto",
                             runner_help=runner_help.QNN_V1_0_1)
    (tmp_path / "test_deploying.py").write_text(DEPLOYING)
    # Under xdist: the workers detect it, the controller writes the meta.
    proc = _run(tmp_path, config, bundle, "test_deploying.py", "-n", "2")
    assert proc.returncode == 0, explain(proc)
    cases = junit_cases(tmp_path / "out")
    assert len(cases) == 2 and {c.properties["runner_dialect"] for c in cases} == {"qnn-v1.0"}
    meta = results_json(tmp_path / "out")["meta"]
    assert meta["runner_dialect"] == "qnn-v1.0"
    assert meta["devices"] and {d["runner_dialect"] for d in meta["devices"]} == {"qnn-v1.0"}

