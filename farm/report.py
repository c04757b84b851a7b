"""Reports of a qualification run: JUnit per device and combined, a Markdown summary, raw JSON.

Failures of the code under test become JUnit ``<failure>``; infrastructure errors become ``<error>``.
The report directory is written under a temporary name and renamed into place, so a crash never leaves
a half-written report where CI looks for one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from junit_xml import TestCase, TestSuite, to_xml_report_string

from farm.qualify import ERROR, FAILED, PASSED, CaseResult


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def junit_suites(results: list[CaseResult]) -> list[TestSuite]:
    by_device: dict[str, list[CaseResult]] = {}
    for r in results:
        by_device.setdefault(r.serial or f"unleased-{r.soc}", []).append(r)
    suites = []
    for device, rows in by_device.items():
        cases = []
        for r in rows:
            tc = TestCase(r.case.id, classname=f"qualify.{r.soc}", elapsed_sec=r.duration_s,
                          stdout=_tok_s_line(r), file=device)
            if r.outcome == FAILED:
                tc.add_failure_info(message=r.message, failure_type="UpdaterMismatch")
            elif r.outcome == ERROR:
                tc.add_error_info(message=r.message, error_type="InfraError",
                                  output="\n".join(r.infra_log))
            cases.append(tc)
        suites.append(TestSuite(f"{rows[0].soc} {device}", cases, hostname=device,
                                properties={"soc": rows[0].soc, "serial": device}))
    return suites


def _tok_s_line(r: CaseResult) -> str:
    parts = [f"{u} {v:.1f} tok/s" for u, v in r.tok_s.items() if v is not None]
    return ", ".join(parts)


def summary_markdown(results: list[CaseResult], meta: dict[str, Any]) -> str:
    counts = {k: sum(r.outcome == k for r in results) for k in (PASSED, FAILED, ERROR)}
    verdict = "PASS" if counts[FAILED] == counts[ERROR] == 0 else \
        ("FAIL" if counts[FAILED] else "INFRA ERROR")
    lines = [f"# Qualification: {verdict}", "",
             f"- bundle: `{meta.get('bundle')}`",
             f"- devices: {', '.join(meta.get('devices', [])) or 'none'}",
             f"- cases: {len(results)} ({counts[PASSED]} passed, {counts[FAILED]} failed, "
             f"{counts[ERROR]} infrastructure errors)",
             f"- wall time: {meta.get('wall_s', 0):.1f} s", "",
             "| SoC | device | case | outcome | SmartMask tok/s | ShiftPointer tok/s | attempts | note |",
             "|---|---|---|---|---:|---:|---:|---|"]
    for r in results:
        sm, sp = r.tok_s.get("SmartMask"), r.tok_s.get("ShiftPointer")
        note = r.message.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.soc} | {r.serial or '-'} | `{r.case.id}` | {r.outcome} | "
                     f"{_num(sm)} | {_num(sp)} | {r.attempts} | {note} |")
    return "\n".join(lines) + "\n"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def write_reports(results: list[CaseResult], out_dir: Path, meta: dict[str, Any]) -> Path:
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        suites = junit_suites(results)
        for suite in suites:
            (staging / f"junit-{_safe(suite.hostname)}.xml").write_text(
                to_xml_report_string([suite], encoding="utf-8"))
        (staging / "junit.xml").write_text(to_xml_report_string(suites, encoding="utf-8"))
        (staging / "summary.md").write_text(summary_markdown(results, meta))
        rows = [asdict(r) for r in results]
        (staging / "results.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
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
