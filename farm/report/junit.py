"""JUnit XML of a run: one ``<testsuite>`` per device, one file each under ``junit/``.

Failures of the code under test are ``<failure>``; infrastructure errors and bad input are ``<error>``,
with every spoiled attempt and its reason in ``system-err``. A test's device evidence (logcat,
tombstones, battery, thermal, the runner's output: farm.device.evidence) is listed there too, each file
also as a ``[[ATTACHMENT|/absolute/path]]`` line of its own, the convention Jenkins' junit-attachments
plugin (and the CI systems that copied it) reads from a test's output.

JUnit is built with ElementTree rather than the junit-xml package, which cannot put ``<properties>``
on a ``<testcase>`` (the serial, SoC, tok/s of each test live there, as pytest's own junitxml does).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import PurePosixPath
from typing import Any

from farm.results.records import TestRecord
from farm.vocab import ErrorKind, Outcome


def safe_file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def device_key(record: TestRecord) -> str:
    return record.serial or f"unleased-{record.soc or 'any'}"


def _text(value: Any) -> str:
    # XML 1.0 cannot carry most control characters; a runner's stderr may contain anything.
    return re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]", "?", str(value))


def _attempts_text(record: TestRecord) -> str:
    return "\n".join(f"attempt {i}: {a.serial or 'no device'}: {a.reason}"
                     for i, a in enumerate(record.attempts, 1))


def _evidence_text(record: TestRecord, report_dir: str) -> str:
    """The evidence files by their path in the report directory, then one attachment line each (an
    absolute path when the report directory is known, as Jenkins wants; else the relative one)."""
    where = f" in {report_dir}" if report_dir else ""
    lines = [f"device evidence ({len(record.evidence)} files{where}):"]
    lines += [f"  {path}" for path in record.evidence]
    lines += [f"[[ATTACHMENT|{PurePosixPath(report_dir, path) if report_dir else path}]]"
              for path in record.evidence]
    return "\n".join(lines)


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
        err = [_attempts_text(r)] if r.attempts else []
        if r.evidence:
            err.append(_evidence_text(r, str(meta.get("report_dir") or "")))
        if err:
            ET.SubElement(case, "system-err").text = _text("\n".join(err))
    return suite


