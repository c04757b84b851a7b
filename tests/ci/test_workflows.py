"""The CI entry points: the GitHub workflow (actionlint), ci/*.sh (shellcheck, when installed), the
annotations ci/annotations.py reads back from a report, and ci/pr-gate.sh / ci/nightly.sh on virtual
devices (step summary, last line, exit codes)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.exitcodes import ExitCode
from farm.report.directory import write_reports
from farm.results.records import Attempt, TestRecord
from farm.vocab import ErrorKind, Outcome
from tests.support.pool import REPO

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
ENTRY_POINTS = [REPO / "ci" / "pr-gate.sh", REPO / "ci" / "nightly.sh", REPO / "ci" / "merge.sh"]
# Variables the scripts read: a test sets the ones it means, never inherits them.
CI_VARS = ("GITHUB_STEP_SUMMARY", "PTEFARM_GATE_SOCS", "PTEFARM_GATE_CONFIG", "PTEFARM_PURPOSE",
           "PTEFARM_BASELINE", "PTEFARM_BUNDLE", "PTEFARM_BASELINE_BUNDLE", "GITHUB_RUN_ID",
           "GITHUB_RUN_ATTEMPT")


def _load_annotations():
    spec = importlib.util.spec_from_file_location("ci_annotations", REPO / "ci" / "annotations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


annotations = _load_annotations()


def _tool(name: str) -> str | None:
    """``name`` from the project's venv (dev dependencies) or PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.is_file() else shutil.which(name)


# -- the workflow ---------------------------------------------------------------------------------------

def test_workflows_pass_actionlint():
    actionlint = _tool("actionlint")
    assert actionlint, "actionlint is missing: it is a dev dependency (pip install -e '.[dev]')"
    assert WORKFLOWS, "no workflow under .github/workflows"
    # actionlint also runs shellcheck on every run: block when shellcheck is installed.
    proc = subprocess.run([actionlint, "-no-color", *map(str, WORKFLOWS)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The check above can fail: a job on an unknown runner label with a bad expression is refused."""
    actionlint = _tool("actionlint")
    assert actionlint
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  j:\n    runs-on: [self-hosted, no-such-label]\n"
                   "    steps:\n      - run: echo ${{ github.nope }}\n")
    proc = subprocess.run([actionlint, "-no-color", str(bad)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "no-such-label" in proc.stdout, proc.stdout + proc.stderr


def test_workflow_runs_the_scripts_on_farm_runners_and_publishes_each_test_once():
    yaml = pytest.importorskip("yaml")
    text = (REPO / ".github" / "workflows" / "ptefarm.yml").read_text()
    wf = yaml.safe_load(text)
    triggers = wf[True]  # YAML 1.1 reads the key `on` as true
    assert {"pull_request", "schedule", "workflow_dispatch"} <= set(triggers)
    jobs = wf["jobs"]
    assert set(jobs) == {"pr-gate", "nightly", "merge"}
    script = {"pr-gate": "ci/pr-gate.sh", "nightly": "ci/nightly.sh", "merge": "ci/merge.sh"}
    for name, job in jobs.items():
        assert job["runs-on"] == ["self-hosted", "ptefarm"], name
        assert 0 < job["timeout-minutes"] <= 360, name
        assert job["concurrency"]["group"], name
        runs = " ".join(s.get("run", "") for s in job["steps"])
        assert script[name] in runs
        uploads = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
        assert len(uploads) == 1 and uploads[0]["if"] == "always()", name
        junit = [s for s in job["steps"] if "publish-unit-test-result-action" in s.get("uses", "")]
        if name == "nightly":  # a shard's tests are published once, by the merge's report
            assert not junit
            continue
        assert len(junit) == 1 and junit[0]["if"] == "always()", name
        assert junit[0]["with"]["files"] == "reports/**/junit/*.xml", name  # each test counted once
    # The qualification is a matrix of shards that never cancel each other, merged by a job that runs
    # whatever they did (a failed or missing shard is named in the merged report, never dropped).
    nightly, merge = jobs["nightly"], jobs["merge"]
    assert "matrix.shard" in " ".join(str(v) for v in nightly["steps"][-2]["env"].values())
    assert nightly["strategy"]["fail-fast"] is False and "shard" in nightly["strategy"]["matrix"]
    assert "--shard" in nightly["steps"][-2]["run"]
    assert merge["needs"] == "nightly" and merge["if"].startswith("always()")
    assert "--group" in merge["steps"][-3]["run"]
    assert "${{ github.event.pull_request.number }}" in jobs["pr-gate"]["concurrency"]["group"]
    assert "head.repo.full_name == github.repository" in jobs["pr-gate"]["if"]  # no fork code on the farm
    assert "secrets." not in text
    for job in jobs.values():  # inputs reach the shell through env, never pasted into a script
        assert all("${{" not in s.get("run", "") for s in job["steps"])


# -- the scripts ----------------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("script", sorted((REPO / "ci").glob("*.sh")), ids=lambda p: p.name)
def test_ci_scripts_pass_shellcheck(script):
    # Every script is free of errors; the CI entry points of every finding, style included.
    severity = "style" if script in ENTRY_POINTS else "error"
    proc = subprocess.run(["shellcheck", "-x", "-S", severity, str(script)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CI_VARS}
    return {**env, **extra}


def _script(name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 420):
    return subprocess.run(["bash", str(REPO / "ci" / name), *args], cwd=REPO, env=env or _env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name,args,env,needle", [
    ("pr-gate.sh", ["--bogus"], {}, "unknown option --bogus"),
    ("pr-gate.sh", ["--out"], {}, "--out needs a value"),
    ("nightly.sh", ["--baseline"], {}, "--baseline needs a value"),
    ("nightly.sh", [], {"PTEFARM_PURPOSE": "weekly"}, "PTEFARM_PURPOSE must be nightly or release"),
    ("nightly.sh", ["SM8650:2"], {}, "bad SoC 'SM8650:2'"),  # a count only for virtual devices
    ("nightly.sh", ["--shard", "1/2"], {}, "--shard needs --group ID"),  # outside a CI run
    ("merge.sh", ["shards/1"], {}, "--out DIR is required"),
    ("merge.sh", ["--out", "r"], {}, "no shard"),
])
def test_bad_usage_is_exit_2_before_any_set_up(name, args, env, needle):
    proc = _script(name, *args, env=_env(**env), timeout=60)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr
    assert needle in proc.stderr and "usage:" in proc.stderr
    assert "::error" not in proc.stdout  # nothing ran: nothing to annotate


@pytest.mark.parametrize("name", ["pr-gate.sh", "nightly.sh", "merge.sh"])
def test_help_documents_the_exit_codes(name):
    proc = _script(name, "--help", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("The ") and "130 interrupted" in proc.stdout
    assert "set -euo" not in proc.stdout


def test_pr_gate_bad_gate_config_and_bad_soc_are_exit_2(tmp_path):
    empty = tmp_path / "gate.toml"
    empty.write_text("[gate]\nsocs = []\n")
    proc = _script("pr-gate.sh", env=_env(PTEFARM_GATE_CONFIG=str(empty)), timeout=120)
    assert proc.returncode == 2 and "no SoC to gate on" in proc.stderr, proc.stderr
    proc = _script("pr-gate.sh", "--virtual", "SM 8650", timeout=120)
    assert proc.returncode == 2 and "bad SoC 'SM 8650'" in proc.stderr, proc.stderr


def test_pr_gate_on_a_virtual_device_appends_the_step_summary(tmp_path, tiny_bundle):
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    out = tmp_path / "gate"
    proc = _script("pr-gate.sh", "--virtual", "--out", str(out), "--bundle", str(tiny_bundle),
                   "--", "-k", "device_answers",
                   env=_env(GITHUB_STEP_SUMMARY=str(summary), PTEFARM_GATE_SOCS="SM8650"))
    assert proc.returncode == ExitCode.OK, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--purpose pr" in proc.stderr and "-m gate" in proc.stderr  # the farm command it ran
    assert proc.stdout.strip().splitlines()[-1] == str((out / "report.html").resolve())
    text = summary.read_text()
    assert text.startswith("earlier step\n# Qualification of reference-tiny: PASS")
    assert "| SM8650 |" in text
    assert "::error" not in proc.stdout and "::warning" not in proc.stdout
    assert [p.name for p in (out / "junit").glob("*.xml")] and (out / "report.html").is_file()


def test_pr_gate_passes_farm_bad_input_on_as_exit_2_and_annotates_it(tmp_path, tiny_bundle):
    summary = tmp_path / "step-summary.md"
    proc = _script("pr-gate.sh", "--virtual", "SM9999", "--out", str(tmp_path / "r"),
                   "--bundle", str(tiny_bundle), env=_env(GITHUB_STEP_SUMMARY=str(summary)), timeout=180)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-3000:]
    assert "::error title=ptefarm%3A exit 2 (BAD_INPUT)::" in proc.stdout
    assert "Exit code 2 (BAD_INPUT)" in summary.read_text()


def test_release_qualification_on_a_virtual_device(tmp_path, tiny_bundle):
    out = tmp_path / "release"
    proc = _script("nightly.sh", "--virtual", "SM8650", "--out", str(out), "--bundle", str(tiny_bundle),
                   "--baseline", "none", "--", "-k", "device_answers",
                   env=_env(PTEFARM_PURPOSE="release"))
    assert proc.returncode == ExitCode.OK, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--purpose release" in proc.stderr and "-m gate" not in proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str((out / "report.html").resolve())
    assert "- purpose: release" in (out / "report.md").read_text()


def test_a_signal_to_the_script_alone_interrupts_farm_exit_130(tmp_path, tiny_bundle):
    """A CI runner cancelling the job signals the script: farm stops (partial report, leases released)."""
    out, log = tmp_path / "nightly", tmp_path / "log"
    with open(log, "w") as f:
        proc = subprocess.Popen(["bash", str(REPO / "ci" / "nightly.sh"), "--virtual", "SM8650",
                                 "--out", str(out), "--bundle", str(tiny_bundle), "--baseline", "none",
                                 "--", "-k", "test_min_throughput"], cwd=REPO, env=_env(), stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)  # no group signal
    try:
        deadline = time.monotonic() + 300
        while "collected" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(1.5)  # into the first tests
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=180) == ExitCode.INTERRUPTED, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "::warning title=ptefarm%3A interrupted::" in text
    assert results_meta(out)["partial"] is True
    assert text.strip().splitlines()[-1] == str((out / "report.html").resolve())


def results_meta(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["meta"]


# -- annotations ----------------------------------------------------------------------------------------

def _report(tmp_path: Path) -> Path:
    """A report as farm writes it: a failure, an infrastructure error, a bad-input error, a pass."""
    details = ("def test_device_answers(device):\n>       assert result.exit_code == 0\n"
               "E       assert 1 == 0\n\nsuites/test_smoke.py:14: AssertionError")
    records = [
        TestRecord("suites/test_smoke.py::test_device_answers[SM8650]", Outcome.FAILED, "SM8650", "dev-a",
                   message="assert 1 == 0", error_type="AssertionError", details=details),
        TestRecord("suites/test_correctness.py::test_updaters_agree[SM8550-kv-story]", Outcome.ERROR,
                   "SM8550", "dev-b", message="DeviceGone: dev-b vanished, mid-run",
                   error_kind=ErrorKind.INFRA, error_type="DeviceGone",
                   attempts=[Attempt("dev-c", "DeviceTimeout: hung")]),
        TestRecord("suites/test_smoke.py::test_runner_loads_every_mode[SM8550]", Outcome.ERROR, "SM8550",
                   "dev-b", message="no mode 'x'", error_kind=ErrorKind.USAGE, error_type="UsageError"),
        TestRecord("suites/test_smoke.py::test_workspace_has_room[SM8650]", Outcome.PASSED, "SM8650",
                   "dev-a"),
    ]
    return write_reports(records, tmp_path / "report", {"run_id": "r1", "purpose": "pr"})


def test_failure_is_an_error_annotation_on_its_file_and_line(tmp_path):
    found = annotations.annotations(_report(tmp_path), 1, REPO)
    failures = [a for a in found if a.title.startswith("Test failure")]
    assert len(failures) == 1
    f = failures[0]
    assert (f.level, f.file, f.line) == ("error", "suites/test_smoke.py", 14)
    assert f.title == "Test failure: test_device_answers[SM8650] (SM8650, dev-a)"
    assert f.command().startswith("::error file=suites/test_smoke.py,line=14,"
                                  "title=Test failure%3A test_device_answers[SM8650] (SM8650%2C dev-a)::"
                                  "assert 1 == 0%0A%0A")


def test_infrastructure_error_is_a_warning_never_a_failure(tmp_path):
    found = annotations.annotations(_report(tmp_path), 1, REPO)
    infra = [a for a in found if "updaters_agree" in a.title]
    assert len(infra) == 1
    a = infra[0]
    assert a.level == "warning"
    assert a.title.startswith("Infrastructure error (not a code failure): ")
    assert "failure:" not in a.title.lower().replace("not a code failure", "")
    assert "infrastructure: DeviceGone" in a.message and "attempt 1: dev-c: DeviceTimeout: hung" in a.message
    # No traceback line: the test function's own line in the real suite file.
    source = (REPO / "suites" / "test_correctness.py").read_text().splitlines()
    assert a.file == "suites/test_correctness.py" and source[a.line - 1].lstrip().startswith(
        "def test_updaters_agree(")
    command = a.command()
    assert command.startswith("::warning file=suites/test_correctness.py,")
    assert "vanished, mid-run" in command  # a message keeps its commas; properties escape theirs
    bad = [a for a in found if a.title.startswith("Bad input")]
    assert [a.level for a in bad] == ["error"] and "bad input: no mode 'x'" in bad[0].message
    assert len(found) == 3  # the passed test is not annotated


def test_regressions_from_the_report_and_a_run_without_report(tmp_path):
    report = _report(tmp_path)
    (report / "report.md").write_text(
        "# Qualification of b: REGRESSION\n\n## Throughput\n\n"
        "- regressed: SM8650 kv 64 SmartMask: median 80.0 vs 100.0 tok/s (-20%), p=0.004\n"
        "- inconclusive: SM8550 kv 64 ShiftPointer: 3 vs 3 samples overlap\n"
        "- improved: SM8750 kv 64 SmartMask: +9%\n")
    gate = [a for a in annotations.annotations(report, 4, REPO) if a.title.startswith("Throughput")]
    assert [(a.level, a.title) for a in gate] == [("error", "Throughput regression"),
                                                  ("warning", "Throughput inconclusive (more runs needed)")]
    assert "median 80.0 vs 100.0" in gate[0].message
    nothing = tmp_path / "never-written"
    for code, level in ((2, "error"), (3, "warning"), (130, "error")):
        [a] = annotations.annotations(nothing, code, REPO)
        assert a.level == level and f"exit {code} ({annotations.EXIT_CODES[code][0]})" in a.title
    assert annotations.annotations(nothing, 0, REPO) == []


def test_annotations_are_capped_per_kind():
    many = [annotations.Annotation("error", f"t{i}", "m") for i in range(13)]
    many += [annotations.Annotation("warning", "w", "m")]
    kept = annotations.capped(many, 10)
    assert [a.level for a in kept].count("error") == 10 and kept[-1].level == "notice"
    assert "3 errors not annotated" in kept[-1].message


def test_the_command_line_appends_the_summary_and_runs_without_the_farm(tmp_path):
    report = _report(tmp_path)
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier\n")
    # -S: no site-packages, so neither the farm nor junitparser: the stdlib is enough.
    proc = subprocess.run([sys.executable, "-S", str(REPO / "ci" / "annotations.py"), str(report),
                           "--exit-code", "1"], cwd=REPO, env=_env(GITHUB_STEP_SUMMARY=str(summary)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["::error", "::warning", "::error"]
    assert summary.read_text().startswith("# earlier\n# Qualification: FAIL")


def test_exit_code_table_is_farms():
    assert {code: name for code, (name, _) in annotations.EXIT_CODES.items()} == \
        {int(c): c.name for c in ExitCode}
