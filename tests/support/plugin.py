"""Helpers of the plugin tests: run pytest (with the ptefarm plugin) in a subprocess and read what it
left: the JUnit files (with junitparser, as a CI system would), results.json and the pool's events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped

from farm.selftest.pytest_files import farm_toml  # noqa: F401  (re-exported: the plugin tests' config)

REPO = Path(__file__).resolve().parents[2]
SUITES = REPO / "suites"


@dataclass
class Case:
    name: str
    outcome: str  # passed, failed, error, skipped
    message: str
    properties: dict[str, str]
    system_err: str
    suite: str


def run_pytest(args: list[str], *, cwd: Path, env: dict[str, str] | None = None,
               timeout: float = 420) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("PYTEST_XDIST_WORKER", None)
    full_env.pop("PYTEST_XDIST_TESTRUNUID", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--rootdir", str(cwd), *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def junit_cases(out: Path) -> list[Case]:
    cases = []
    for path in sorted((out / "junit").glob("*.xml")):
        for suite in JUnitXml.fromfile(str(path)):
            for case in suite:
                results = case.result
                outcome, message = "passed", ""
                for r in results:
                    if isinstance(r, Failure):
                        outcome, message = "failed", r.message or ""
                    elif isinstance(r, Error):
                        outcome, message = "error", r.message or ""
                    elif isinstance(r, Skipped):
                        outcome, message = "skipped", r.message or ""
                # junitparser reads <testcase> results but not their <properties>: read those raw.
                props = {p.get("name"): p.get("value") for p in case._elem.iter("property")}
                cases.append(Case(case.name, outcome, message, props, case.system_err or "",
                                  suite.name))
    return cases


def results_json(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def write_cases(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-3000:]}"


# A test file whose first attempt meets an infrastructure error on its device (FIRST_MARKER names
# the file that records which device), and whose re-run passes.
FLAKY_ONCE = """
import os
from farm.errors import AdbError

def test_flaky_once(device):
    marker = os.environ["FIRST_MARKER"]
    if not os.path.exists(marker):  # the first attempt meets an infrastructure error on its device
        with open(marker, "w") as f:
            f.write(device.serial)
        raise AdbError("adb: transport reset mid-command (injected by the test)", serial=device.serial)
"""
