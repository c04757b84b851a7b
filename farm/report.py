"""Reports of a run: JUnit (one file, one ``<testsuite>`` per device), a Markdown summary, raw JSON.

Layout of a report directory::

    junit/<device>.xml   one <testsuite> per device; tests that never got a device: unleased-<SoC>.xml
    summary.md           verdict first, then one row per test
    results.json         meta + every record with its attempts and measurements (format below)

Only ``junit/`` holds XML, so a CI glob of ``junit/*.xml`` (or ``**/*.xml``) counts every test once.
Failures of the code under test are ``<failure>``; infrastructure errors and bad input are
``<error>``, with every spoiled attempt and its reason in ``system-err``. The directory is written
under a temporary name and renamed into place: a crash never leaves half a report where CI looks.

results.json is ``{"format": "ptefarm-results/2", "schema_version": 2, "tool_version",
"generated_at" (ISO 8601 UTC), "meta", "results"}``; meta carries run_id, purpose, git_revision,
bundle_name, bundle_digest, runner_dialect, started_at, ended_at, wall_s, verdict, virtual, partial,
tool_version, units ({metric: unit}), devices, manifest (the bundle's files) and infra_events.
``load_results`` reads it, and the ``ptefarm-results/1`` files of older runs.

JUnit is built with ElementTree rather than the junit-xml package, which cannot put ``<properties>``
on a ``<testcase>`` (the serial, SoC, tok/s of each test live there, as pytest's own junitxml does).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from farm.errors import UsageError
from farm.results import (
    RESULTS_SCHEMA_VERSION,
    UNITS,
    ErrorKind,
    Outcome,
    ResultLog,
    RunResults,
    TestRecord,
    Verdict,
    journal_paths,
    tool_version,
    verdict,
)

RESULTS_FORMAT = f"ptefarm-results/{RESULTS_SCHEMA_VERSION}"
# Formats load_results reads; version 1 (before the results store) had no schema_version, units,
# devices or manifest list, and its meta.manifest was the manifest's path.
READABLE_FORMATS = {"ptefarm-results/1": 1, RESULTS_FORMAT: RESULTS_SCHEMA_VERSION}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def device_key(record: TestRecord) -> str:
    return record.serial or f"unleased-{record.soc or 'any'}"


def _text(value: Any) -> str:
    # XML 1.0 cannot carry most control characters; a runner's stderr may contain anything.
    return re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]", "?", str(value))


def _attempts_text(record: TestRecord) -> str:
    return "\n".join(f"attempt {i}: {a.serial or 'no device'}: {a.reason}"
                     for i, a in enumerate(record.attempts, 1))


def junit_suite(device: str, records: list[TestRecord], meta: dict[str, Any]) -> ET.Element:
    counts = {o: sum(r.outcome == o for r in records) for o in Outcome}
    suite = ET.Element("testsuite", {
        "name": device, "hostname": device, "tests": str(len(records)),
        "failures": str(counts[Outcome.FAILED]), "errors": str(counts[Outcome.ERROR]),
        "skipped": str(counts[Outcome.SKIPPED]),
        "time": f"{sum(r.duration_s for r in records):.3f}",
        "timestamp": meta.get("started_at", ""),
    })
    props = ET.SubElement(suite, "properties")
    suite_props = {"run_id": meta.get("run_id", ""), "git_revision": meta.get("git_revision", ""),
                   "bundle": meta.get("bundle_name", ""), "bundle_digest": meta.get("bundle_digest", ""),
                   "soc": records[0].soc or "", "serial": records[0].serial or ""}
    for key, value in suite_props.items():
        ET.SubElement(props, "property", {"name": key, "value": _text(value)})
    for r in records:
        case = ET.SubElement(suite, "testcase", {
            "classname": r.nodeid.partition("::")[0].removesuffix(".py").replace("/", "."),
            "name": r.name, "time": f"{r.duration_s:.3f}", "file": r.nodeid.partition("::")[0]})
        cprops = ET.SubElement(case, "properties")
        fields = {"serial": r.serial or "", "soc": r.soc or "", "attempts": str(len(r.attempts) + 1),
                  **r.properties}
        for key, value in fields.items():
            ET.SubElement(cprops, "property", {"name": key, "value": _text(value)})
        if r.outcome == Outcome.FAILED:
            el = ET.SubElement(case, "failure", {"message": _text(r.message),
                                                 "type": r.error_type or "AssertionError"})
            el.text = _text(r.details)
        elif r.outcome == Outcome.ERROR:
            kind = "bad input" if r.error_kind == ErrorKind.USAGE else "infrastructure"
            el = ET.SubElement(case, "error", {"message": _text(f"{kind}: {r.message}"),
                                               "type": r.error_type or "InfraError"})
            el.text = _text(r.details)
        elif r.outcome == Outcome.SKIPPED:
            ET.SubElement(case, "skipped", {"message": _text(r.message)})
        if r.attempts:
            ET.SubElement(case, "system-err").text = _text(_attempts_text(r))
    return suite


def summary_markdown(records: list[TestRecord], meta: dict[str, Any]) -> str:
    v = Verdict(meta["verdict"]) if "verdict" in meta else verdict(records)
    counts = {o: sum(r.outcome == o for r in records) for o in Outcome}
    title = {Verdict.PASS: "PASS", Verdict.FAIL: "FAIL", Verdict.INFRA_ERROR: "INFRA ERROR",
             Verdict.BAD_INPUT: "BAD INPUT"}[v]
    partial = " (PARTIAL: the run was interrupted)" if meta.get("partial") else ""
    lines = [f"# Qualification: {title}{partial}", "",
             f"- bundle: `{meta.get('bundle_name', '?')}` (sha256 `{meta.get('bundle_digest', '?')[:16]}`,"
             f" dialect {meta.get('runner_dialect', '?')})",
             f"- run: `{meta.get('run_id', '?')}` at {meta.get('started_at', '?')}, "
             f"git {meta.get('git_revision') or 'unknown'}",
             f"- devices: {', '.join(sorted({r.serial for r in records if r.serial})) or 'none'}"
             + (" (virtual)" if meta.get("virtual") else ""),
             f"- tests: {len(records)} ({counts[Outcome.PASSED]} passed, {counts[Outcome.FAILED]} "
             f"failed, {counts[Outcome.ERROR]} errors, {counts[Outcome.SKIPPED]} skipped)",
             f"- wall time: {meta.get('wall_s', 0):.1f} s", "",
             "| SoC | device | test | outcome | tok/s | attempts | note |",
             "|---|---|---|---|---|---:|---|"]
    for r in records:
        rates = ", ".join(f"{k.removeprefix('tok_s.')} {v}" for k, v in r.properties.items()
                          if k.startswith("tok_s."))
        note = r.message
        if r.attempts:
            note = f"{note} [earlier: {'; '.join(f'{a.serial}: {a.reason}' for a in r.attempts)}]"
        note = note.replace("|", "\\|").replace("\n", " ")[:400]
        lines.append(f"| {r.soc or '-'} | {r.serial or '-'} | `{r.name}` | {r.outcome} | "
                     f"{rates or '-'} | {len(r.attempts) + 1} | {note} |")
    return "\n".join(lines) + "\n"


def complete_meta(records: list[TestRecord], meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with what every written run carries (verdict, purpose, tool version, units), as
    results.json and the results store both keep it."""
    meta = dict(meta)
    meta.setdefault("verdict", verdict(records, interrupted=bool(meta.get("partial"))).value)
    meta.setdefault("purpose", "adhoc")
    meta.setdefault("written_at", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    meta.setdefault("tool_version", tool_version())
    meta.setdefault("units", dict(UNITS))
    return meta


def write_reports(records: list[TestRecord], out_dir: Path, meta: dict[str, Any]) -> Path:
    """Write the report directory atomically (replacing an older one) and return its path."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    meta = complete_meta(records, meta)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        by_device: dict[str, list[TestRecord]] = {}
        for r in records:
            by_device.setdefault(device_key(r), []).append(r)
        (staging / "junit").mkdir()
        for device, rows in sorted(by_device.items()):
            tree = ET.ElementTree(junit_suite(device, rows, meta))
            ET.indent(tree)
            tree.write(staging / "junit" / f"{_safe(device)}.xml", encoding="utf-8",
                       xml_declaration=True)
        (staging / "summary.md").write_text(summary_markdown(records, meta), encoding="utf-8")
        (staging / "results.json").write_text(results_json(records, meta), encoding="utf-8")
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(out_dir, old)
            os.rename(staging, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def results_json(records: list[TestRecord], meta: dict[str, Any]) -> str:
    """The text of results.json (format ptefarm-results/2)."""
    body = {"format": RESULTS_FORMAT, "schema_version": RESULTS_SCHEMA_VERSION,
            "tool_version": tool_version(),
            "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "meta": meta, "results": [r.to_json() for r in records]}
    return json.dumps(body, indent=2, ensure_ascii=False)


def load_results(path: str | os.PathLike) -> RunResults:
    """A results.json (or a report directory holding one) as RunResults; formats 1 and 2. Anything
    else is a UsageError naming the file and what is wrong with it."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such results file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
    fmt = body.get("format") if isinstance(body, dict) else None
    if fmt not in READABLE_FORMATS:
        raise UsageError(f"{path}: format {fmt!r} is not a ptefarm results file this version reads "
                         f"({', '.join(READABLE_FORMATS)})")
    meta, raw_records = body.get("meta"), body.get("results")
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: field 'meta' must be an object")
    if not isinstance(raw_records, list):
        raise UsageError(f"{path}: field 'results' must be a list")
    records = []
    for i, raw in enumerate(raw_records):
        try:
            records.append(TestRecord.from_json(raw))
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise UsageError(f"{path}: results[{i}] is not a test record: {e}") from None
    # A version-1 meta is returned as it is (its manifest a path, no purpose): readers default what
    # it lacks (the store saves it as purpose adhoc), rather than this loader inventing values.
    return RunResults(meta=meta, records=records)


def recover(out_dir: Path) -> Path:
    """Write the report of a run that died before writing it (SIGKILL, a crash of the host) from its
    journal: every test that finished is in it; the report is marked partial."""
    log_path, meta_path = journal_paths(out_dir)
    if not log_path.exists():
        from farm.errors import UsageError

        raise UsageError(f"{out_dir}: no journal of an unfinished run here (expected {log_path})")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        meta = {}
    meta.update(partial=True, recovered=True)
    meta.pop("verdict", None)
    written = write_reports(ResultLog.read(log_path), out_dir, meta)
    log_path.unlink(missing_ok=True)
    meta_path.unlink(missing_ok=True)
    return written
