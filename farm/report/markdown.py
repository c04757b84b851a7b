"""The Markdown of a run: the release qualification report (report.md) and the run summary (summary.md).

``render_markdown`` renders a ``QualificationReport`` (farm.report.qualification) for a CI step summary or
a release ticket; ``summary_markdown`` is the short per-test table every report directory carries.
"""

from __future__ import annotations

from typing import Any

from farm.report.qualification import (QualificationReport, cell_text, document_title, error_label, facts,
                                        fmt_p, fmt_pct, gate_line, outcome_label)
from farm.results.records import TestRecord, verdict
from farm.vocab import Outcome, Timing, Verdict


def _md(text: Any, limit: int = 300) -> str:
    """One table cell: no pipes, no newlines, no HTML a Markdown viewer would render."""
    s = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("\r", " ")
    s = s.replace("<", "&lt;").replace(">", "&gt;")
    return s if len(s) <= limit else s[:limit - 1] + "…"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _evidence_lines(records: list[TestRecord]) -> list[str]:
    """One line per test with device evidence: where its files are, relative to the report directory
    (report.html shows their excerpts)."""
    lines = [f"- evidence of {_md(r.name)}: {_md(', '.join(r.evidence), 600)}" for r in records if r.evidence]
    return lines + [""] if lines else []


def render_markdown(q: QualificationReport) -> str:
    title, why = q.headline
    partial = " (partial)" if q.partial else ""
    lines = [f"# {_md(document_title(q.meta.get('bundle_name'), title + partial))}", "",
             f"**{why}.** Exit code {int(q.exit_code)}.", ""]
    lines += [f"- {label}: {_md(value)}" for label, value in facts(q)]
    lines += [f"- regression gate: {_md(gate_line(q))}"]
    lines += [f"- note: {_md(n)}" for n in q.gate.notes + q.notes] + [""]

    lines += ["## SoC x suite", ""]
    lines += _table(["SoC", *q.suites], [[soc, *(cell_text(q.cell(soc, s)) for s in q.suites)]
                                         for soc in q.socs])
    if q.failures:
        lines += ["## Failures (the code under test)", ""]
        lines += _table(["SoC", "device", "test", "message"],
                        [[r.soc or "-", r.serial or "-", r.name, r.message] for r in q.failures])
        lines += _evidence_lines(q.failures)
    if q.errors:
        lines += ["## Errors (no verdict: not failures of the code under test)", ""]
        lines += _table(["SoC", "device", "test", "kind", "attempts", "message"],
                        [[r.soc or "-", r.serial or "-", r.name, error_label(r), len(r.attempts) + 1,
                          r.message] for r in q.errors])
        lines += _evidence_lines(q.errors)
    if q.throughput:
        lines += ["## Throughput", ""]
        lines += _table(["SoC", "mode", "seq_len", "updater", "figures", "n", "median", "min-max",
                         "threshold", "baseline median", "delta", "gate", "p"],
                        [[p.key.soc, p.key.mode, p.key.seq_len, p.key.updater, Timing.label(p.key.timing),
                          len(p.now), f"{p.now_median:.1f} {p.unit}", f"{min(p.now):.1f}-{max(p.now):.1f}",
                          "-" if p.threshold is None else
                          f"{p.threshold:g} {'ok' if p.threshold_ok else 'BELOW'}",
                          "-" if p.base is None else f"{p.base_median:.1f} (n={len(p.base)})",
                          fmt_pct(p.delta), p.verdict, fmt_p(p.p_value)] for p in q.throughput])
        why = sorted({f"{p.verdict}: {p.reason}" for p in q.throughput
                      if p.verdict in ("regressed", "inconclusive", "improved")})
        lines += [f"- {_md(w)}" for w in why[:12]] + ([""] if why else [])
    spreads, odd = q.unit_spreads, q.unit_outcomes
    if spreads or odd:
        lines += ["## Units of a SoC (every test on every device)", ""]
        lines += [f"- {_md(n)}" for n in q.unit_notes] + ([""] if q.unit_notes else [])
    if spreads:
        lines += _table(["SoC", "test", "updater", "mode", "seq_len", "units (median)", "spread", "outlier"],
                        [[p.soc, p.test, p.updater, p.mode, p.seq_len,
                          "; ".join(f"{f.serial}: {f.median:.1f}" + ("" if f.delta is None else f" ({f.delta:+.1%})")
                                    for f in p.figures),
                          f"{p.spread:.1%}", ", ".join(f.serial for f in p.outliers) or "-"] for p in spreads])
    if odd:
        lines += _table(["SoC", "test", "outcome per unit"],
                        [[u.soc, u.test, "; ".join(f"{s}: {o}" for s, o in u.outcomes.items())] for u in odd])
    if q.trends:
        lines += ["## Trends over history", "", f"{_md(q.trends_of)} (the HTML report draws them)", ""]
        lines += _table(["point", "runs", "change points"],
                        [[t.label, t.runs, "; ".join(f"run {c.run_id}: {c.delta:+.1%}" for c in t.changes) or "-"]
                         for t in q.trends])
    if q.correctness:
        lines += ["## Correctness (SmartMask vs ShiftPointer)", ""]
        lines += _table(["SoC", "test", "mode", "seq_len", "prompt", "outcome", "first divergence", "note"],
                        [[c.soc, c.test, c.mode or "-", c.seq_len or "-", c.case, outcome_label(
                            c.outcome, c.error_kind), c.first_divergence or "-",
                          "" if c.outcome == Outcome.PASSED else c.message] for c in q.correctness])
    lines += ["## Devices", ""]
    lines += _table(["serial", "SoC", "model", "Android", "HTP", "virtual", "figures"],
                    [[d.serial, d.soc, d.model or "-", d.android or "-", d.htp_arch or "-",
                      {True: "yes", False: "no", None: "?"}[d.virtual], d.figures] for d in q.devices])
    lines += ["## Infrastructure events", ""]
    events = q.infra_events
    lines += _table(["at", "device", "kind", "test", "reason"],
                    [[e.at or "-", e.serial or "-", e.kind, e.test or "-", e.reason] for e in events]) \
        if events else ["none", ""]
    lines += [f"## Bundle manifest (runner dialect {_md(q.meta.get('runner_dialect', '?'))})", ""]
    lines += _table(["file", "role", "HTP", "size", "sha256"],
                    [[f.name, f.role or "-", f.htp_arch or "-", "-" if f.size is None else f.size,
                      f.sha256[:16]] for f in q.manifest]) if q.manifest else ["not recorded", ""]
    return "\n".join(lines).rstrip() + "\n"


def _figures_of(records: list[TestRecord]) -> str:
    """Where the run's figures come from (farm.vocab.Timing), as summary.md says it."""
    timings = {r.properties.get("timing", "") for r in records
               if any(k.startswith("tok_s.") for k in r.properties) or r.measurements}
    return ", ".join(sorted({Timing.figures_of(t) for t in timings})) or "none"


def summary_markdown(records: list[TestRecord], meta: dict[str, Any]) -> str:
    v = Verdict(meta["verdict"]) if "verdict" in meta else verdict(records)
    counts = {o: sum(r.outcome == o for r in records) for o in Outcome}
    title = {Verdict.PASS: "PASS", Verdict.FAIL: "FAIL", Verdict.INFRA_ERROR: "INFRA ERROR",
             Verdict.BAD_INPUT: "BAD INPUT"}[v]
    stopped = meta.get("stopped") if not meta.get("interrupted") else None
    partial = ((" (PARTIAL: the farm stopped the run)" if stopped else " (PARTIAL: the run was interrupted)")
               if meta.get("partial") else "")
    lines = [f"# {_md(document_title(meta.get('bundle_name'), title + partial))}", "",
             f"- bundle: `{meta.get('bundle_name', '?')}` (sha256 `{meta.get('bundle_digest', '?')[:16]}`,"
             f" dialect {meta.get('runner_dialect', '?')})",
             f"- run: `{meta.get('run_id', '?')}` at {meta.get('started_at', '?')}, "
             f"git {meta.get('git_revision') or 'unknown'}",
             f"- devices: {', '.join(sorted({r.serial for r in records if r.serial})) or 'none'}"
             + (" (virtual)" if meta.get("virtual") else ""),
             f"- figures: {_figures_of(records)}",
             f"- tests: {len(records)} ({counts[Outcome.PASSED]} passed, {counts[Outcome.FAILED]} "
             f"failed, {counts[Outcome.ERROR]} errors, {counts[Outcome.SKIPPED]} skipped)",
             f"- wall time: {meta.get('wall_s', 0):.1f} s",
             *([f"- stopped: {_md(stopped)}; the tests after it did not run"] if stopped else []), "",
             "| SoC | device | test | outcome | tok/s | attempts | note |",
             "|---|---|---|---|---|---:|---|"]
    for r in records:
        rates = ", ".join(f"{k.removeprefix('tok_s.')} {v}" for k, v in r.properties.items()
                          if k.startswith("tok_s."))
        if rates and r.properties.get("timing") != Timing.MEASURED:
            rates += f" ({Timing.label(r.properties.get('timing', ''))})"
        note = r.message
        if r.attempts:
            note = f"{note} [earlier: {'; '.join(f'{a.serial}: {a.reason}' for a in r.attempts)}]"
        note = note.replace("|", "\\|").replace("\n", " ")[:400]
        lines.append(f"| {r.soc or '-'} | {r.serial or '-'} | `{r.name}` | {r.outcome} | "
                     f"{rates or '-'} | {len(r.attempts) + 1} | {note} |")
    return "\n".join(lines) + "\n"


