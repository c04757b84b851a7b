"""The PyTorch benchmark v3 export: valid against the schema kept in tests/support/schemas, every measured run
kept, failures as FAILURE_REPORT and infrastructure errors never as failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from farm.report.benchmark_v3 import records
from farm.results.gate import evaluate
from farm.vocab import Outcome
from tests.report.test_html import sample_run, write_results
from tests.support.plugin import explain

SCHEMA = json.loads((Path(__file__).parents[1] / "support" / "schemas" / "pytorch-benchmark-v3.schema.json").read_text())


def _validate(data) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(data)


def _export(**kw):
    now, base = sample_run(**kw), sample_run(run_id="run-base")
    return records(now, evaluate(now, base))


def test_export_validates_against_the_schema():
    data = _export(slow=0.8)
    _validate(data)
    assert len(data) == 8 + 2  # 8 throughput points, one failure, one error


def test_the_schema_rejects_what_the_database_would():
    """The schema can fail: each of these breaks a column's type or a required field."""
    good = _export()[0]
    breakages = [
        lambda r: r["metric"].update(benchmark_values=0),             # a scalar, not Array(Float32)
        lambda r: r["metric"].pop("target_value"),
        lambda r: r["benchmark"]["extra_info"].update(seq_len=64),    # Map(String, String)
        lambda r: r["runners"][0].update(cpu_count=-1),               # UInt32
        lambda r: r.update(benchmark_value=[1.0]),                    # a misspelt field
        lambda r: r.update(runners=[]),
    ]
    for breakage in breakages:
        bad = json.loads(json.dumps(good))
        breakage(bad)
        with pytest.raises(jsonschema.ValidationError):
            _validate([bad])


def test_throughput_records_keep_every_sample_and_the_gate():
    data = _export(slow=0.8)
    tput = [r for r in data if r["metric"]["name"] == "token_per_sec(host-cpu)"]
    point = next(r for r in tput if r["benchmark"]["extra_info"]["updater"] == "SmartMask"
                 and r["runners"][0]["extra_info"]["soc"] == "SM8650"
                 and r["benchmark"]["extra_info"]["seq_len"] == "64")
    assert point["metric"]["benchmark_values"] == pytest.approx([78.5, 79.5, 80.0, 80.4, 81.1, 81.8], abs=0.01)
    assert point["metric"]["target_value"] == 20.0
    assert point["metric"]["extra_info"]["gate_verdict"] == "regressed"
    assert point["runners"][0]["name"] == "Virtual SM8650"
    assert point["runners"][0]["type"] == "Android 14"
    assert point["model"] == {"name": "reference-tiny", "type": "OSS model", "backend": "xnnpack",
                              "origins": [], "extra_info": {"bundle_digest": "f" * 64}}
    assert {r["benchmark"]["extra_info"]["updater"] for r in tput} == {"SmartMask", "ShiftPointer"}
    assert {r["runners"][0]["extra_info"]["soc"] for r in tput} == {"SM8650", "SM8550"}


def test_failures_are_failure_reports_and_infra_errors_are_not():
    data = _export()
    by_metric = {}
    for r in data:
        by_metric.setdefault(r["metric"]["name"], []).append(r)
    [failure] = by_metric["FAILURE_REPORT"]
    assert failure["benchmark"]["extra_info"]["kind"] == "test failure"
    assert failure["benchmark"]["extra_info"]["job_conclusion"] == "failure"
    [error] = by_metric["ERROR_REPORT"]
    assert error["benchmark"]["extra_info"]["kind"] == "infrastructure"
    assert error["benchmark"]["extra_info"]["job_conclusion"] == "error"
    assert "vanished" in error["benchmark"]["extra_info"]["message"]


def test_an_errored_throughput_test_exports_no_samples():
    run = sample_run()
    for r in run.records:
        if r.suite == "test_throughput":
            r.outcome = Outcome.ERROR
    data = records(run)
    _validate(data)
    assert not [r for r in data if r["metric"]["name"].startswith("token_per_sec")]


def test_farm_report_format_v3(tmp_path):
    now = write_results(sample_run(), tmp_path / "now")
    proc = subprocess.run([sys.executable, "-P", "-m", "farm.cli.main", "report", str(now), "--format",
                           "pytorch-benchmark-v3", "--out", str(tmp_path / "out")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PTEFARM_HOME": str(tmp_path / "farm-home")})
    assert proc.returncode == 1, explain(proc)  # the sample run has a failed test
    path = tmp_path / "out" / "benchmark-v3.json"
    assert proc.stdout.strip() == f"pytorch-benchmark-v3: {path}"
    _validate(json.loads(path.read_text()))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["benchmark-v3.json"]


def test_only_a_measured_figure_has_the_measured_metrics_name():
    """Host CPU, simulated and unknown timings each get a name of their own in the v3 export: a
    dashboard that plots token_per_sec plots phones' measurements alone."""
    now = sample_run()
    timings = {"SM8650": "host-cpu", "SM8550": ""}
    for r in now.records:
        for m in r.measurements:
            m.timing = timings[r.soc]
        r.properties.pop("timing", None)
    names = {(r["runners"][0]["extra_info"]["soc"], r["metric"]["name"]) for r in records(now)
             if r["metric"]["name"].startswith("token_per_sec")}
    assert names == {("SM8650", "token_per_sec(host-cpu)"), ("SM8550", "token_per_sec(unknown timing)")}


def test_a_simulated_figure_never_reads_as_a_measured_one():
    now = sample_run()
    for r in now.records:
        for m in r.measurements:
            m.timing = "simulated" if r.soc == "SM8650" else "measured"
    data = records(now)
    tput = [r for r in data if r["metric"]["name"].startswith("token_per_sec")]
    for r in tput:
        simulated = r["runners"][0]["extra_info"]["soc"] == "SM8650"
        assert r["metric"]["name"] == ("token_per_sec(simulated)" if simulated else "token_per_sec")
        assert r["benchmark"]["extra_info"]["simulated"] == str(simulated).lower()
        assert r["benchmark"]["extra_info"]["timing"] == ("simulated" if simulated else "measured")
    _validate(data)
