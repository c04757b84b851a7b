"""A run's report directory, written atomically: JUnit, the Markdown summary, results.json.

Layout::

    junit/<device>.xml   one <testsuite> per device; tests that never got a device: unleased-<SoC>.xml
    summary.md           verdict first, then one row per test
    results.json         meta + every record with its attempts and measurements (farm.results.jsonfile)

Only ``junit/`` holds XML, so a CI glob of ``junit/*.xml`` (or ``**/*.xml``) counts every test once.
The directory is written under a temporary name and renamed into place: a crash never leaves half a
report where CI looks. A run that died before writing it is recovered from its journal.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from farm.errors import UsageError
from farm.report.junit import device_key, junit_suite, safe_file_name
from farm.report.markdown import summary_markdown
from farm.results.jsonfile import results_json
from farm.results.records import UNITS, ResultLog, TestRecord, journal_paths, tool_version, verdict


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
            tree.write(staging / "junit" / f"{safe_file_name(device)}.xml", encoding="utf-8",
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


def recover(out_dir: Path) -> Path:
    """Write the report of a run that died before writing it (SIGKILL, a crash of the host) from its
    journal: every test that finished is in it; the report is marked partial."""
    log_path, meta_path = journal_paths(out_dir)
    if not log_path.exists():
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
