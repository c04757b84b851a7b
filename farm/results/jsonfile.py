"""results.json: a run's meta and every record with its attempts and measurements.

The file is ``{"format": "ptefarm-results/2", "schema_version": 2, "tool_version",
"generated_at" (ISO 8601 UTC), "meta", "results"}``; meta carries run_id, purpose, git_revision,
bundle_name, bundle_digest, runner_dialect, started_at, ended_at, wall_s, verdict, virtual, partial,
tool_version, units ({metric: unit}), devices, manifest (the bundle's files) and infra_events.
``load_results`` reads it, and the ``ptefarm-results/1`` files of older runs.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from farm.errors import UsageError
from farm.results.records import RESULTS_SCHEMA_VERSION, QualificationResults, TestRecord, tool_version

RESULTS_FORMAT = f"ptefarm-results/{RESULTS_SCHEMA_VERSION}"
# Formats load_results reads; version 1 (before the results store) had no schema_version, units,
# devices or manifest list, and its meta.manifest was the manifest's path.
READABLE_FORMATS = {"ptefarm-results/1": 1, RESULTS_FORMAT: RESULTS_SCHEMA_VERSION}


def results_json(records: list[TestRecord], meta: dict[str, Any]) -> str:
    """The text of results.json (format ptefarm-results/2)."""
    body = {"format": RESULTS_FORMAT, "schema_version": RESULTS_SCHEMA_VERSION,
            "tool_version": tool_version(),
            "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "meta": meta, "results": [r.to_json() for r in records]}
    return json.dumps(body, indent=2, ensure_ascii=False)


def load_results(path: str | os.PathLike) -> QualificationResults:
    """A results.json (or a report directory holding one) as QualificationResults; formats 1 and 2. Anything
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
    return QualificationResults(meta=meta, records=records)


