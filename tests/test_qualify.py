"""The qualification run: parallel over leased virtual devices, failures vs infra errors, reports."""

from __future__ import annotations

import threading
import time
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from farm.cli.main import main as farm_main
from farm.devices import discover
from farm.pool import LeaseRequest, Pool
from farm.qualify import (
    ERROR,
    FAILED,
    PASSED,
    Case,
    CaseResult,
    Qualification,
    QualifyPlan,
)
from farm.report import write_reports
from farm.virtual import VirtualDeviceSpec
from tests.device_helpers import make_qnn_bundle

STORY = Case(name="story", mode="kv", prompt="Once upon a time", seq_len=40)


def _pool(tmp_path, **options) -> Pool:
    return Pool.open(f"sqlite:///{tmp_path / 'pool.db'}", **options)


def _junit_counts(path):
    root = ET.parse(path).getroot()
    return (len(root.findall(".//testcase")), len(root.findall(".//failure")),
            len(root.findall(".//error")))


def test_reference_bundle_qualifies_on_two_socs_in_parallel(virtual_farm, tiny_bundle, tmp_path):
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8550")])
    servers = [virtual_farm.adb_server]
    with _pool(tmp_path) as pool:
        pool.sync(discover(servers), servers)
        plan = QualifyPlan(manifest=tiny_bundle, socs=["SM8550", "SM8650"],
                           cases=[STORY, Case("story", "hybrid", "Once upon a time", 40)])
        results = Qualification(plan, pool, servers, workers=2).run()
        assert [(r.soc, r.outcome) for r in results] == [("SM8550", PASSED)] * 2 + \
            [("SM8650", PASSED)] * 2
        assert {r.serial for r in results} == {d.serial for d in virtual_farm.devices}
        assert all(r.tok_s["SmartMask"] and r.tok_s["ShiftPointer"] for r in results)
        # Nothing leaked: every lease was given back.
        assert {d.device.state for d in pool.status().devices} == {"available"}
    out = write_reports(results, tmp_path / "report", {"bundle": str(tiny_bundle)})
    per_device = sorted(out.glob("junit-*.xml"))
    assert len(per_device) == 2
    assert _junit_counts(out / "junit.xml") == (4, 0, 0)
    assert (out / "summary.md").read_text().startswith("# Qualification: PASS")


def test_updater_mismatch_is_a_failure_not_an_infra_error(virtual_farm, tmp_path):
    """A runner whose output depends on --kv_updater (here: a fake that echoes its argv) fails the gate."""
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    servers = [virtual_farm.adb_server]
    manifest = make_qnn_bundle(tmp_path / "bundle")
    with _pool(tmp_path) as pool:
        pool.sync(discover(servers), servers)
        plan = QualifyPlan(manifest=manifest, socs=["SM8650"], cases=[STORY])
        [result] = Qualification(plan, pool, servers, workers=1).run()
    assert result.outcome == FAILED
    assert "diverge" in result.message
    out = write_reports([result], tmp_path / "report", {})
    assert _junit_counts(out / "junit.xml") == (1, 1, 0)
    assert "# Qualification: FAIL" in (out / "summary.md").read_text()


def test_hung_device_is_an_infra_error_retried_on_another_device(virtual_farm, tiny_bundle, tmp_path):
    bad, good = virtual_farm.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8650")])
    virtual_farm.set_faults(bad.serial, hang_commands="farm-llama-runner")
    servers = [virtual_farm.adb_server]
    with _pool(tmp_path, quarantine_after=1) as pool:
        pool.sync(discover(servers), servers)
        # Hold the good device so that the first attempt lands on the hung one.
        held = pool.acquire(LeaseRequest(serial=good.serial), timeout_s=10)
        plan = QualifyPlan(manifest=tiny_bundle, socs=["SM8650"], cases=[STORY],
                           run_timeout_s=25)  # generous: a loaded CI box must not time out the good one
        results: list[CaseResult] = []
        worker = threading.Thread(target=lambda: results.extend(
            Qualification(plan, pool, servers, workers=1).run()))
        worker.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            states = {d.device.serial: d.device.state for d in pool.status().devices}
            if states[bad.serial] == "quarantined":
                break
            time.sleep(0.2)
        held.release()
        worker.join(timeout=180)
        assert not worker.is_alive()
    [result] = results
    assert result.outcome == PASSED
    assert result.serial == good.serial
    assert result.attempts == 2
    assert bad.serial in result.infra_log[0] and "Timeout" in result.infra_log[0]


def test_no_device_for_a_soc_is_an_error_not_a_failure(virtual_farm, tiny_bundle, tmp_path):
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    servers = [virtual_farm.adb_server]
    with _pool(tmp_path) as pool:
        pool.sync(discover(servers), servers)
        plan = QualifyPlan(manifest=tiny_bundle, socs=["SM8750"], cases=[STORY], lease_timeout_s=1)
        [result] = Qualification(plan, pool, servers, workers=1).run()
    assert result.outcome == ERROR
    assert "SM8750" in result.message


def test_junit_keeps_failures_and_errors_apart(tmp_path):
    rows = [CaseResult(STORY, "SM8650", PASSED, "ok", "dev-a", 1.0, tok_s={"SmartMask": 10.0}),
            CaseResult(STORY, "SM8650", FAILED, "diverge at 3", "dev-a", 1.0),
            CaseResult(STORY, "SM8550", ERROR, "DeviceGone: dev-b vanished", "dev-b", 1.0,
                       infra_log=["dev-b: DeviceGone"])]
    out = write_reports(rows, tmp_path / "r", {})
    assert _junit_counts(out / "junit-dev-a.xml") == (2, 1, 0)
    assert _junit_counts(out / "junit-dev-b.xml") == (1, 0, 1)
    # Rewriting replaces the report whole and leaves no staging directory behind.
    write_reports(rows[:1], tmp_path / "r", {})
    assert _junit_counts(out / "junit.xml") == (1, 0, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_farm_qualify_cli_on_virtual_devices(tmp_path, tiny_bundle):
    out = tmp_path / "reports"
    result = CliRunner().invoke(farm_main, ["qualify", "--virtual", "SM8650", "--bundle",
                                            str(tiny_bundle), "--seq-len", "100", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert _junit_counts(out / "junit.xml") == (4, 0, 0)
    assert "reports:" in result.output


@pytest.mark.parametrize("args,needle", [(["--virtual", "SM9999"], "SM9999"),
                                         (["--seq-len", "1"], "--seq-len"),
                                         (["--priority", "urgent"], "urgent")])
def test_farm_qualify_bad_input(args, needle, tmp_path, tiny_bundle):
    result = CliRunner().invoke(farm_main, ["qualify", "--bundle", str(tiny_bundle), "--out",
                                            str(tmp_path / "r"), *args])
    assert result.exit_code == 2
    assert needle in result.output
    assert not (tmp_path / "r").exists()
