"""Test results as the farm keeps them: one record per test, every attempt inside it.

The pytest plugin turns pytest's reports into ``TestRecord``s and the report writers (farm.report) turn
records into JUnit, Markdown and JSON. The outcome vocabulary keeps the two families of trouble apart:

- ``failed``: the code under test is wrong (updaters diverge, throughput under its minimum, a runner
  that crashed). JUnit ``<failure>``. Never retried.
- ``error``: the farm could not give a verdict (device gone, adb error, timeout, pool down, or bad
  input such as a case that cannot run). JUnit ``<error>``; infrastructure errors were retried first.

``ResultLog`` appends each record to a JSON-lines file as the test finishes (flushed and fsynced), so a
run that is killed still leaves every finished result behind for the report.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from farm.vocab import ErrorKind, Outcome, Verdict

__all__ = ["RESULTS_SCHEMA_VERSION", "UNITS", "Attempt", "Measurement", "ResultLog", "QualificationResults",
           "TestRecord", "tool_version", "verdict"]

# The version of the results.json layout (farm.report) and of a run the results store keeps.
RESULTS_SCHEMA_VERSION = 2
# The unit of every metric the farm's suites and records carry (results.json meta.units).
UNITS = {"tok_s": "tok/s", "duration_s": "s"}


def tool_version() -> str:
    """The installed ptefarm's version, as results name the tool that made them."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ptefarm")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


@dataclass
class Attempt:
    """One try of a test that the infrastructure spoiled, before it was run again."""

    serial: str | None
    reason: str
    duration_s: float = 0.0


@dataclass
class Measurement:
    """Every measured run of one metric at one point (warm-ups dropped), raw: the regression gate and
    the report need the samples, not only their median."""

    metric: str                 # "tok_s"
    unit: str                   # "tok/s"
    values: list[float]
    updater: str = ""
    mode: str = ""
    seq_len: int = 0
    threshold: float | None = None  # the minimum the median must reach, when a rule gives one

    @property
    def key(self) -> tuple[str, str, int, str]:
        """What a baseline's measurement is matched on (with the SoC of its record)."""
        return (self.metric, self.mode, self.seq_len, self.updater)


@dataclass
class QualificationResults:
    """One run as the report writers and the results store exchange it: ``meta`` is the run
    (run_id, purpose, git_revision, bundle_name, bundle_digest, runner_dialect, started_at, ended_at,
    wall_s, verdict, virtual, tool_version, devices, manifest, infra_events, ...), ``records`` its tests."""

    meta: dict[str, Any]
    records: list[TestRecord]


@dataclass
class TestRecord:
    __test__ = False  # not a pytest test class, despite its name
    nodeid: str
    outcome: Outcome
    soc: str | None = None
    serial: str | None = None
    message: str = ""  # one line: why it failed, erred or was skipped
    details: str = ""  # the long form (traceback, runner stderr tail)
    error_kind: ErrorKind | None = None
    error_type: str = ""  # exception class name, for JUnit's type attribute
    duration_s: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)  # spoiled tries before this result
    properties: dict[str, str] = field(default_factory=dict)  # htp_arch, bundle, tok/s, ...
    finished_at: float = 0.0
    measurements: list[Measurement] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.nodeid.rpartition("::")[2]

    @property
    def suite(self) -> str:
        """The test module without directories and extension: ``test_correctness``."""
        path = self.nodeid.partition("::")[0]
        return Path(path).stem

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> TestRecord:
        raw = dict(raw)
        raw["outcome"] = Outcome(raw["outcome"])
        raw["error_kind"] = ErrorKind(raw["error_kind"]) if raw.get("error_kind") else None
        raw["attempts"] = [Attempt(**a) for a in raw.get("attempts", [])]
        raw["measurements"] = [Measurement(**m) for m in raw.get("measurements", [])]
        return cls(**raw)


def verdict(records: list[TestRecord], *, interrupted: bool = False) -> Verdict:
    """Failures win over errors: a real defect is reported as such even if a device also died."""
    if any(r.outcome == Outcome.FAILED for r in records):
        return Verdict.FAIL
    errors = [r for r in records if r.outcome == Outcome.ERROR]
    if any(r.error_kind == ErrorKind.USAGE for r in errors):
        return Verdict.BAD_INPUT
    if errors or interrupted:
        return Verdict.INFRA_ERROR
    return Verdict.PASS


class ResultLog:
    """Append-only JSON lines, one record per finished test, durable as soon as ``add`` returns."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def add(self, record: TestRecord) -> None:
        self._file.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    @staticmethod
    def read(path: Path) -> list[TestRecord]:
        """Every complete line; a line cut short by a kill is ignored (its test did not finish)."""
        records = []
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        for line in lines:
            try:
                records.append(TestRecord.from_json(json.loads(line)))
            except (json.JSONDecodeError, TypeError, KeyError, ValueError):
                continue
        return records


def journal_paths(out_dir: Path) -> tuple[Path, Path]:
    """Where a run writing its report to ``out_dir`` journals as it goes: the result log and the run's
    meta, beside the report directory (which only appears, whole, at the end)."""
    out_dir = Path(out_dir)
    return (out_dir.parent / f".{out_dir.name}.results.jsonl",
            out_dir.parent / f".{out_dir.name}.meta.json")
