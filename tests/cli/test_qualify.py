"""`farm qualify`: the suites through pytest and the plugin, and the reports it leaves."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from farm.cli.qualify import exit_code
from farm.report.directory import write_reports
from farm.results.records import Attempt, TestRecord, verdict
from farm.vocab import ErrorKind, Outcome, Verdict
from tests.support.plugin import explain, junit_cases, results_json


def _farm(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "farm.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=420)


def test_farm_qualify_on_a_virtual_device(tmp_path, tiny_bundle):
    out = tmp_path / "reports"
    proc = _farm("qualify", "--virtual", "SM8650", "--bundle", str(tiny_bundle), "--out", str(out),
                 "--", "-k", "device_answers or kv-story or kv-64-SmartMask", cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert "+ pytest " in proc.stderr  # the pytest run it is, for a user to repeat
    cases = {c.name: c for c in junit_cases(out)}
    assert sorted(cases) == ["test_device_answers[SM8650]", "test_kv_matches_hybrid[SM8650-kv-story]",
                             "test_min_throughput[SM8650-kv-64-SmartMask]",
                             "test_updaters_agree[SM8650-kv-story]"]
    # qnn-v1.0 has both updaters: the updater comparison runs and kv-against-hybrid says why it does not
    assert cases["test_kv_matches_hybrid[SM8650-kv-story]"].outcome == "skipped"
    assert cases["test_updaters_agree[SM8650-kv-story]"].outcome == "passed"
    assert (out / "summary.md").read_text().startswith("# Qualification of reference-tiny: PASS")
    assert [p.name for p in out.rglob("*.xml")] == [p.name for p in (out / "junit").glob("*.xml")]
    assert results_json(out)["meta"]["verdict"] == "pass"


@pytest.mark.parametrize("args,needle", [(["--virtual", "SM9999"], "SM9999"),
                                         (["--virtual", "SM8650", "--soc", "SM8750"], "SM8750"),
                                         (["--virtual", "SM8650", "--priority", "urgent"], "urgent"),
                                         (["--bundle", "missing/manifest.json"], "manifest")])
def test_farm_qualify_bad_input_is_exit_2(args, needle, tmp_path, tiny_bundle):
    if "--bundle" not in args:
        args = [*args, "--bundle", str(tiny_bundle)]
    proc = _farm("qualify", "--out", str(tmp_path / "r"), *args, cwd=tmp_path)
    assert proc.returncode == 2, explain(proc)
    assert needle in proc.stdout + proc.stderr
    assert not (tmp_path / "r").exists()


def _records() -> list[TestRecord]:
    return [
        TestRecord("suites/test_c.py::test_a[SM8650-kv-story]", Outcome.PASSED, "SM8650", "dev-a",
                   properties={"tok_s.SmartMask": "10.0"}),
        TestRecord("suites/test_c.py::test_a[SM8650-kv-short]", Outcome.FAILED, "SM8650", "dev-a",
                   message="diverge at 3", error_type="Failed"),
        TestRecord("suites/test_c.py::test_a[SM8550-kv-story]", Outcome.ERROR, "SM8550", "dev-b",
                   message="DeviceGone: dev-b vanished", error_kind=ErrorKind.INFRA,
                   error_type="DeviceGone", attempts=[Attempt("dev-c", "DeviceTimeout: hung")]),
    ]


def test_junit_keeps_failures_and_errors_apart_one_suite_per_device(tmp_path):
    out = write_reports(_records(), tmp_path / "r", {"run_id": "r1", "git_revision": "abc"})
    suites = {p.stem: ET.parse(p).getroot() for p in (out / "junit").glob("*.xml")}
    assert set(suites) == {"dev-a", "dev-b"}
    a, b = suites["dev-a"], suites["dev-b"]
    assert (a.get("tests"), a.get("failures"), a.get("errors")) == ("2", "1", "0")
    assert (b.get("tests"), b.get("failures"), b.get("errors")) == ("1", "0", "1")
    assert b.find("testcase/error").get("message").startswith("infrastructure: DeviceGone")
    assert "attempt 1: dev-c: DeviceTimeout: hung" in b.find("testcase/system-err").text
    props = {p.get("name"): p.get("value") for p in a.find("properties")}
    assert props["run_id"] == "r1" and props["git_revision"] == "abc"
    # Rewriting replaces the report whole and leaves no staging directory behind.
    write_reports(_records()[:1], tmp_path / "r", {})
    assert [p.stem for p in (out / "junit").glob("*.xml")] == ["dev-a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_verdicts_and_exit_codes(tmp_path):
    records = _records()
    assert verdict(records) == Verdict.FAIL  # a real defect wins over a dead device
    assert verdict(records[2:]) == Verdict.INFRA_ERROR
    usage = TestRecord("x", Outcome.ERROR, error_kind=ErrorKind.USAGE)
    assert verdict([records[0], usage]) == Verdict.BAD_INPUT
    assert verdict(records[:1]) == Verdict.PASS
    assert verdict(records[:1], interrupted=True) == Verdict.INFRA_ERROR
    out = write_reports(records[2:], tmp_path / "r", {})
    assert exit_code(1, out / "results.json") == 3
    assert exit_code(4, out / "results.json") == 2  # pytest usage error
    assert exit_code(2, tmp_path / "missing.json") == 130
    write_reports(records[:1], tmp_path / "r", {"partial": True, "interrupted": True})
    assert exit_code(2, out / "results.json") == 130


# -- the report and the regression gate, end to end (issue 12) ---------------------------------------

ONE_POINT = """warmup = 1
runs = 5
prompt = "Once upon a time"

[[min]]
soc = "*"
mode = "kv"
seq_len = 64
updater = "SmartMask"
tok_s = 1.0
"""


def _qualify_on(vf_config, bundle, out, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    """farm qualify on the test's own virtual farm, one throughput point (5 measured runs)."""
    thresholds = tmp_path / "thresholds.toml"
    thresholds.write_text(ONE_POINT)
    return _farm("qualify", "--config", str(vf_config), "--bundle", str(bundle), "--out", str(out),
                 "--retries", "0", *extra, "--", "-k", "test_min_throughput", "--farm-thresholds",
                 str(thresholds), cwd=tmp_path)


def test_a_slowed_device_regresses_against_its_baseline(virtual_farm, tiny_bundle, tmp_path):
    """The host runner sleeps per decoded token (fault runner_delay_ms), so the figures are dominated
    by a delay the test sets: 20 ms for the baseline and the unchanged run, 60 ms for the slowed one
    (20 ms, not less: a loaded 2-core host adds a few ms of noise per token to a tiny model's ~1 ms)."""
    from farm.virtual import VirtualDeviceSpec
    from tests.support.plugin import farm_toml

    [dev] = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port,
                       f"sqlite:///{tmp_path / 'pool.db'}")
    virtual_farm.set_faults(dev.serial, runner_delay_ms=20)
    base = _qualify_on(config, tiny_bundle, tmp_path / "base", tmp_path)
    assert base.returncode == 0, explain(base)
    assert base.stdout.strip().splitlines()[-1] == str(tmp_path / "base" / "report.html")

    gate = ("--baseline", str(tmp_path / "base"), "--min-effect", "25")
    same = _qualify_on(config, tiny_bundle, tmp_path / "same", tmp_path, *gate)
    assert same.returncode == 0, explain(same)
    md = (tmp_path / "same" / "report.md").read_text()
    assert md.startswith("# Qualification of reference-tiny: PASS"), md
    assert "| SM8650 | kv | 64 | SmartMask | host CPU | 5 |" in md and "| unchanged |" in md, md

    virtual_farm.set_faults(dev.serial, runner_delay_ms=60)
    slow = _qualify_on(config, tiny_bundle, tmp_path / "slow", tmp_path, *gate)
    assert slow.returncode == 4, explain(slow)  # every test passed: the gate failed
    md = (tmp_path / "slow" / "report.md").read_text()
    assert md.startswith("# Qualification of reference-tiny: REGRESSION"), md
    assert "| regressed |" in md, md
    assert results_json(tmp_path / "slow")["meta"]["verdict"] == "pass"  # the tests themselves passed
    html_text = (tmp_path / "slow" / "report.html").read_text()
    # one point at one seq_len: of the plots only baseline-vs-now says more than the table
    assert "regressed" in html_text and html_text.count("<svg") == 1 and 'aria-label="plot-baseline"' in html_text


def test_sigint_during_qualify_leaves_no_half_report_and_no_lease(virtual_farm, tiny_bundle, tmp_path):
    import signal
    import time

    from farm.pool import Pool
    from farm.virtual import VirtualDeviceSpec
    from tests.support.plugin import farm_toml

    [dev] = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port, url)
    virtual_farm.set_faults(dev.serial, runner_delay_ms=300)  # the measurement takes minutes
    (tmp_path / "thresholds.toml").write_text(ONE_POINT)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-P", "-m", "farm.cli.main", "qualify", "--config", str(config),
                             "--bundle", str(tiny_bundle), "--out", str(out), "--", "-k",
                             "test_min_throughput", "--farm-thresholds", str(tmp_path / "thresholds.toml")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def leased() -> bool:
        try:
            with Pool.open(url) as pool:
                return any(d.lease for d in pool.status().devices)
        except Exception:  # the pool may not exist yet
            return False

    deadline = time.monotonic() + 180
    while not leased():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output
    with Pool.open(url) as pool:
        assert [d.lease for d in pool.status().devices] == [None]  # released, not left to its TTL
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")]
    leftovers += [p.name for p in out.rglob("*") if p.name.startswith(".")] if out.exists() else []
    assert leftovers == []  # no staging directory, journal or temp file
    if (out / "report.html").exists():  # written whole, and saying what it is
        text = (out / "report.html").read_text()
        assert text.endswith("</html>\n") and "INTERRUPTED" in text


def test_farm_qualify_on_simulated_phones_marks_every_figure_simulated(tmp_path, tiny_bundle):
    """--virtual-timing phone (ci/qualify.sh's long-context leg): the devices are simulated phones,
    and the run's figures say SIMULATED, never measured."""
    out = tmp_path / "reports"
    proc = _farm("qualify", "--virtual", "SM8650", "--virtual-timing", "phone", "--bundle", str(tiny_bundle),
                 "--out", str(out), "--", "-k", "kv-64-SmartMask", cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert "--farm-virtual-timing phone" in proc.stderr
    [case] = junit_cases(out)
    assert case.properties["timing"] == "simulated"
    [m] = [m for r in results_json(out)["results"] for m in r["measurements"]]
    assert m["timing"] == "simulated"
    assert "SIMULATED" in (out / "report.md").read_text()
    bad = _farm("qualify", "--virtual", "SM8650", "--virtual-timing", "fast", "--bundle", str(tiny_bundle),
                "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert bad.returncode == 2 and "fast" in bad.stderr
