"""Test results as the farm keeps them: one record per test, every attempt inside it.

The pytest plugin turns pytest's reports into ``TestRecord``s and the report writers (farm.report) turn
records into JUnit, Markdown and JSON. The outcome vocabulary keeps the two families of trouble apart:

- ``failed``: the code under test is wrong (updaters diverge, throughput under its minimum, a runner
  that crashed). JUnit ``<failure>``. Never retried.
- ``error``: the farm could not give a verdict (device gone, adb error, timeout, pool down, or bad
  input such as a case that cannot run). JUnit ``<error>``; infrastructure errors were retried first.

``ResultLog`` appends each record to a JSON-lines file as the test finishes (fsynced), so a run that
is killed still leaves every finished result behind for the report.
"""

from __future__ import annotations

import contextlib
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
    timing: str = ""  # farm.vocab.Timing of the device's figures; "" when no device told it
    # One per value (farm.device.conditions, before and after its run, and whether it was re-taken);
    # empty where the measuring code kept none.
    conditions: list[dict] = field(default_factory=list)

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
    # The device's evidence of the test (logcat, tombstones, battery, thermal, the runner's output):
    # paths relative to the report directory, ``evidence/<test>/<file>`` (farm.device.evidence).
    evidence: list[str] = field(default_factory=list)

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
    """Append-only JSON lines, one record per finished test, durable as soon as ``add`` returns.

    Each line carries the run's id, so a journal is never read as another run's. A write the file
    system refuses part-way (it filled) keeps the rest of its line pending, written before the next
    line once there is room again, so no line is ever interleaved with another; a journal found torn
    when opened (its writer died mid-line) is continued on a fresh line. A torn line is the only
    line lost."""

    def __init__(self, path: Path, run_id: str | None = None):
        self.path = Path(path)
        self.run_id = run_id
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._pending = b"\n" if _ends_torn(self.path) else b""  # bytes owed before the next line

    def add(self, record: TestRecord) -> None:
        line = json.dumps({"run_id": self.run_id, **record.to_json()}, ensure_ascii=False) + "\n"
        self._pending += line.encode("utf-8")
        self._write_pending()

    def _write_pending(self) -> None:
        while self._pending:  # an OSError leaves what was not written pending
            self._pending = self._pending[os.write(self._fd, self._pending):]
        os.fsync(self._fd)

    def close(self) -> None:
        try:
            if self._pending:
                with contextlib.suppress(OSError):  # still no room: those lines are lost with it
                    self._write_pending()
        finally:
            os.close(self._fd)

    @staticmethod
    def read(path: Path, run_id: str | None = None) -> list[TestRecord]:
        """Every complete line (of ``run_id``'s run, when given); a line cut short by a kill or a
        full file system is ignored (its test's record was never whole)."""
        runs = ResultLog.read_runs(path)
        if run_id is None:
            return [r for records in runs.values() for r in records]
        return runs.get(run_id, []) + runs.get(None, [])

    @staticmethod
    def read_runs(path: Path) -> dict[str | None, list[TestRecord]]:
        """The complete records of the journal by run id (None: lines written before lines carried
        it), in the order they were written."""
        runs: dict[str | None, list[TestRecord]] = {}
        try:
            lines = Path(path).read_bytes().splitlines()
        except FileNotFoundError:
            return {}
        for line in lines:
            try:
                raw = json.loads(line.decode("utf-8"))
                run_id = raw.pop("run_id", None)
                record = TestRecord.from_json(raw)
            except (UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError, ValueError,
                    AttributeError):
                continue
            runs.setdefault(run_id, []).append(record)
        return runs


def _ends_torn(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return True


def journal_paths(out_dir: Path) -> tuple[Path, Path]:
    """Where a run writing its report to ``out_dir`` journals as it goes: the result log and the run's
    meta, beside the report directory (which only appears, whole, at the end). One run at a time
    writes them (the report directory's lock, farm.report.directory); a journal a killed run left is
    set aside under its run id (``set_aside_paths``) by the next run, for ``farm report recover``."""
    out_dir = Path(out_dir)
    return (out_dir.parent / f".{out_dir.name}.results.jsonl",
            out_dir.parent / f".{out_dir.name}.meta.json")


def set_aside_paths(out_dir: Path, run_id: str) -> tuple[Path, Path]:
    """Where the journal of killed run ``run_id`` is kept once another run uses ``out_dir``."""
    log_path, meta_path = journal_paths(out_dir)
    return (log_path.with_name(f"{log_path.name}.{run_id}"),
            meta_path.with_name(f"{meta_path.name}.{run_id}"))
