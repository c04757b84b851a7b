"""The release qualification report as one self-contained HTML page.

Self-contained means nothing is fetched at view time: the CSS is inline, the plots are inline SVG
(farm.report.plots), there is no script, no font, no image URL. Everything from a run is data and is escaped
with ``html.escape`` (prompts and runner messages contain ``<``, quotes, ``$(reboot)``...). Long
details (tracebacks, both samples of a point) are in ``<details>`` elements, which need no script.

Given the report directory the page is written in, each failed or errored test shows its device
evidence folded in: the logcat lines around the crash, a tombstone's summary, the runner's stderr tail,
each read from the directory when the page is rendered (bounded, undecodable bytes replaced, escaped)
and linked to the whole file. Without it the evidence files are only linked.
"""

from __future__ import annotations

import html
import os
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from farm.report import plots
from farm.report.qualification import (
    QualificationReport,
    cell_text,
    document_title,
    error_label,
    evidence_excerpts,
    facts,
    fmt_p,
    fmt_pct,
    gate_line,
    outcome_label,
    safe_evidence_path,
)
from farm.results.gate import GateVerdict, PointResult
from farm.results.records import TestRecord
from farm.vocab import Outcome, Timing

__all__ = ["render_html"]

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto;
       max-width: 1200px; padding: 0 16px 48px; color: #1b1b1b; }
h1 { font-size: 22px; margin: 16px 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px;
  border-bottom: 1px solid #ddd; padding-bottom: 3px; }
.banner { padding: 12px 16px; border-radius: 6px; margin: 12px 0; font-size: 16px; }
.banner b { font-size: 20px; margin-right: 10px; }
.v-pass { background: #e6f4ea; border: 1px solid #2e7d32; }
.v-fail { background: #fdecea; border: 1px solid #c62828; }
.v-regression { background: #fdecea; border: 1px solid #c62828; }
.v-infra, .v-bad, .v-interrupted { background: #fff4e5; border: 1px solid #b26a00; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f5f5f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.why { min-width: 16em; }
.passed, .unchanged, .improved { color: #2e7d32; } .failed, .regressed { color: #c62828; font-weight: 600; }
.error, .inconclusive { color: #b26a00; font-weight: 600; } .skipped, .new { color: #777; }
.not-measured { color: #6a1b9a; font-weight: 600; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; }
dl.facts dt { color: #555; } dl.facts dd { margin: 0; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
pre { white-space: pre-wrap; word-break: break-word; background: #fafafa; padding: 6px; margin: 4px 0; }
.plots svg { max-width: 100%; height: auto; display: block; margin: 8px 0; }
.note { color: #555; }
details.excerpt { margin: 4px 0; } details.excerpt pre { max-height: 32em; overflow: auto; }
"""

EXIT_CLASS = {0: "v-pass", 1: "v-fail", 4: "v-regression", 2: "v-bad", 3: "v-infra", 130: "v-interrupted"}


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(header: list[str], rows: list[list[str]], *, raw: bool = False) -> str:
    """A table; cells are escaped unless ``raw`` (then each cell is HTML built here, already escaped)."""
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(c if raw else f"<td>{e(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def td(text: Any, cls: str = "") -> str:
    return f'<td class="{e(cls)}">{e(text)}</td>' if cls else f"<td>{e(text)}</td>"


def _outcome_td(outcome: Outcome, error_kind=None) -> str:
    return td(outcome_label(outcome, error_kind), str(outcome))


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{e(summary)}</summary><pre>{e(body)}</pre></details>" if body else ""


def condition_text(c: dict) -> str:
    """One sample's conditions in a line: what the phone was doing while it ran."""
    before, after = c.get("before") or {}, c.get("after") or {}

    def temp(d: dict) -> str:
        return "?" if d.get("battery_temp_c") is None else f"{d['battery_temp_c']:.1f}"

    parts = [f"{temp(before)} -> {temp(after)}",
             f"status {after.get('thermal_status', '?')}", f"idle {after.get('idle') or '?'}",
             f"battery {after.get('battery_level', '?')} %" + (" charging" if after.get("charging") else ""),
             after.get("governors") or "governor ?",
             {True: "screen on", False: "screen off"}.get(after.get("screen_on"), "screen ?")]
    return ", ".join(parts) + (" THROTTLED" if c.get("throttled") else "")


def _samples(p: PointResult) -> str:
    now = " ".join(f"{v:.2f}" for v in p.now)
    base = "none" if p.base is None else " ".join(f"{v:.2f}" for v in p.base)
    text = f"now ({len(p.now)}): {now}\nbaseline ({0 if p.base is None else len(p.base)}): {base}"
    kept = [(v, c) for v, c in zip(p.now, p.conditions) if c]
    if kept:
        text += "\nconditions (battery C before -> after, thermal status, idle, battery, governors, screen):"
        for v, c in kept:
            text += f"\n  {v:.2f}: {condition_text(c)}"
    return text


def _throughput(q: QualificationReport) -> str:
    rows = []
    for p in q.throughput:
        threshold = "-" if p.threshold is None else f"{p.threshold:g} " + ("ok" if p.threshold_ok else "BELOW")
        figures = Timing.label(p.key.timing)
        rows.append([td(p.key.soc), td(p.key.mode), td(p.key.seq_len, "num"), td(p.key.updater),
                     td(figures, "" if p.key.timing == Timing.MEASURED else "not-measured"),
                     td(len(p.now), "num"), td(f"{p.now_median:.1f}", "num"),
                     td(f"{min(p.now):.1f} – {max(p.now):.1f}", "num"),
                     td(threshold, "" if p.threshold_ok in (None, True) else "failed"),
                     td("-" if p.base is None else f"{p.base_median:.1f} (n={len(p.base)})", "num"),
                     td(fmt_pct(p.delta), "num"), td(p.verdict, str(p.verdict)), td(fmt_p(p.p_value), "num"),
                     td("-" if p.prob_greater is None else f"{p.prob_greater:.2f}", "num"),
                     f'<td class="why">{e(p.reason)}{_details("samples", _samples(p))}</td>'])
    unit = q.throughput[0].unit if q.throughput else "tok/s"
    return _table(["SoC", "mode", "seq_len", "updater", "figures", "n", f"median {unit}", "min – max", "threshold",
                   "baseline median", "delta", "gate", "p", "P(now>base)", "why / samples"], rows, raw=True)


def _plots(q: QualificationReport) -> str:
    """The plots that say more than the table (each plot function leaves itself out otherwise)."""
    drawn = [plots.tok_s_by_soc(q.throughput), plots.tok_s_vs_seq_len(q.throughput),
             plots.baseline_vs_now(q.throughput)]
    svgs = [s for s in drawn if s]
    if svgs:
        return f'<div class="plots">{"".join(svgs)}</div>'
    return ('<p class="note">no plots: a single point, one seq_len per line and no baseline leave a plot '
            'nothing the table does not say</p>')


def _trends(q: QualificationReport) -> str:
    out = [f'<p class="note">{e(q.trends_of)}: per-run medians (min-max as a band), change points '
           f'marked (ruptures PELT, each step checked by a Welch t-test and a 3 % minimum).</p>']
    for t in q.trends:
        moved = "; ".join(f"run {c.run_id}: {c.before:.1f} -> {c.after:.1f} ({c.delta:+.1%}, p {c.p_value:.1g})"
                          for c in t.changes) or "no change point"
        out.append(f"<h3>{e(t.label)}</h3><p>{t.runs} run(s); {e(moved)}</p>{t.svg or ''}")
    return "\n".join(out)


def _evidence(paths: list[str]) -> str:
    """Links to a test's device evidence (logcat, tombstones, ...), relative to the report directory
    the page is written in. Only plain relative paths are linked (a record is data: no scheme, no
    absolute path, no ``..``); the rest are shown as text."""
    links = [_link(path) for path in paths]
    return f'<div class="evidence">device evidence: {", ".join(links)}</div>' if links else ""


def _link(path: str) -> str:
    """A link to one evidence file when its path is safe (``safe_evidence_path``), else its path as text."""
    if not safe_evidence_path(path):
        return f'<span class="mono">{e(path)}</span>'
    return f'<a href="{e(quote(path, safe="/"))}">{e(PurePosixPath(path).name)}</a>'


def _excerpts(record: TestRecord, report_dir: str | os.PathLike | None) -> str:
    """``record``'s evidence, read from ``report_dir`` and folded: a ``<details>`` per excerpt, each
    with a link to its whole file; a note naming the files that are not there."""
    if report_dir is None or not record.evidence:
        return ""
    found, missing = evidence_excerpts(record, report_dir)
    out = [f'<details class="excerpt"><summary>{e(x.title)}</summary><pre>{e(x.text)}</pre>'
           f"<div>whole file: {_link(x.path)}</div></details>" for x in found]
    if missing:
        out.append(f'<p class="note">not in the report directory: '
                   f'{e(", ".join(PurePosixPath(p).name for p in missing))}</p>')
    return "".join(out)


def _problems(q: QualificationReport, report_dir: str | os.PathLike | None = None) -> str:
    out = []
    if q.failures:
        rows = [[td(r.soc or "-"), td(r.serial or "-"), f'<td class="mono">{e(r.name)}</td>',
                 f"<td>{e(r.message)}{_details('details', r.details)}{_evidence(r.evidence)}"
                 f"{_excerpts(r, report_dir)}</td>"]
                for r in q.failures]
        out.append("<h2>Failures (the code under test)</h2>"
                   + _table(["SoC", "device", "test", "message"], rows, raw=True))
    if q.errors:
        rows = [[td(r.soc or "-"), td(r.serial or "-"), f'<td class="mono">{e(r.name)}</td>',
                 td(error_label(r), "error"), td(len(r.attempts) + 1, "num"),
                 f"<td>{e(r.message)}{_details('details', r.details)}{_evidence(r.evidence)}"
                 f"{_excerpts(r, report_dir)}</td>"]
                for r in q.errors]
        out.append("<h2>Errors (no verdict: not failures of the code under test)</h2>"
                   + _table(["SoC", "device", "test", "kind", "attempts", "message"], rows, raw=True))
    return "".join(out)


def _correctness(q: QualificationReport) -> str:
    rows = q.correctness
    if not rows:
        return '<p class="note">no correctness tests in this run</p>'
    body = [[td(c.soc), td(c.test), td(c.mode or "-"), td(c.seq_len or "-", "num"), td(c.case),
             _outcome_td(c.outcome, c.error_kind), td(c.first_divergence or "-"),
             td("" if c.outcome == Outcome.PASSED else c.message)] for c in rows]
    return _table(["SoC", "test", "mode", "seq_len", "prompt", "outcome", "first divergence", "note"], body,
                  raw=True)


def _units(q: QualificationReport) -> str:
    """--farm-dist each: each point's figures per unit of its SoC, the outlier flagged; the tests whose
    outcome differs between units."""
    spreads, odd = q.unit_spreads, q.unit_outcomes
    if not spreads and not odd:
        return ""
    out = ["<h2>Units of a SoC (every test on every device)</h2>"]
    out += [f'<p class="note">{e(n)}</p>' for n in q.unit_notes]
    if spreads:
        rows = []
        for p in spreads:
            cells = "; ".join(
                (f'<b class="failed">{e(f.serial)}: {f.median:.1f} ({f.delta:+.1%}) OUTLIER</b>' if f.outlier else
                 e(f"{f.serial}: {f.median:.1f}" + ("" if f.delta is None else f" ({f.delta:+.1%})")))
                for f in p.figures)
            rows.append([td(p.soc), f'<td class="mono">{e(p.test)}</td>', td(p.updater), td(p.mode),
                         td(p.seq_len, "num"), f"<td>{cells}</td>", td(f"{p.spread:.1%}", "num")])
        out.append(_table(["SoC", "test", "updater", "mode", "seq_len", "units: median (off the others)",
                           "spread"], rows, raw=True))
    if odd:
        out.append(_table(["SoC", "test", "outcome per unit"],
                          [[u.soc, u.test, "; ".join(f"{s}: {o}" for s, o in u.outcomes.items())] for u in odd]))
    return "".join(out)


def render_html(q: QualificationReport, report_dir: str | os.PathLike | None = None) -> str:
    """The page of ``q``. ``report_dir``: the directory the page is written in (its records' evidence
    paths are relative to it), read for the excerpts of failed and errored tests' evidence; None:
    the evidence is linked, not excerpted."""
    title, why = q.headline
    m = q.meta
    bundle = m.get("bundle_name")
    partial = " (partial)" if q.partial else ""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # Nothing may be fetched: no external source of any kind, even by a later edit of the page.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; img-src data:\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(document_title(bundle, title + partial))}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{e(document_title(bundle))}</h1>",
        f'<div class="banner {EXIT_CLASS[int(q.exit_code)]}" id="verdict"><b>{e(title + partial)}</b>'
        f"{e(why)} (exit code {int(q.exit_code)})</div>",
        '<dl class="facts">' + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in facts(q))
        + f"<dt>regression gate</dt><dd class=\"{e(q.gate.verdict)}\">{e(gate_line(q))}</dd></dl>",
    ]
    for note in q.gate.notes + q.notes:
        parts.append(f'<p class="note">Note: {e(note)}</p>')
    parts.append("<h2>SoC x suite</h2>")
    matrix = []
    for soc in q.socs:
        cells = []
        for s in q.suites:
            c = q.cell(soc, s)
            cls = ("failed" if c[Outcome.FAILED] else "error" if c[Outcome.ERROR]
                   else "passed" if c[Outcome.PASSED] else "skipped")
            cells.append(td(cell_text(c), cls if c else ""))
        matrix.append([td(soc), *cells])
    parts.append(_table(["SoC", *q.suites], matrix, raw=True))
    parts.append(_problems(q, report_dir))
    parts.append("<h2>Throughput</h2>")
    if q.throughput:
        if q.gate.verdict == GateVerdict.NO_BASELINE:
            parts.append('<p class="note">No baseline: every point is "new"; the thresholds still apply.</p>')
        parts.append(_throughput(q))
        parts.append(_plots(q))
    else:
        parts.append('<p class="note">no throughput measured in this run</p>')
    parts.append(_units(q))
    if q.trends:
        parts.append("<h2>Trends over history</h2>")
        parts.append(_trends(q))
    parts.append("<h2>Correctness (SmartMask vs ShiftPointer, temperature 0)</h2>")
    parts.append(_correctness(q))
    parts.append("<h2>Devices</h2>")
    parts.append(_table(["serial", "SoC", "model", "Android", "HTP", "virtual", "figures"],
                        [[d.serial, d.soc, d.model or "-", d.android or "-", d.htp_arch or "-",
                          {True: "yes", False: "no", None: "?"}[d.virtual], d.figures]
                         for d in q.devices]))
    parts.append("<h2>Infrastructure events and attempts</h2>")
    events = q.infra_events
    parts.append(_table(["at", "device", "kind", "test", "reason"],
                        [[x.at or "-", x.serial or "-", x.kind, x.test or "-", x.reason] for x in events])
                 if events else '<p class="note">none</p>')
    parts.append(f"<h2>Bundle manifest</h2><p>runner dialect <code>{e(m.get('runner_dialect', '?'))}</code>, "
                 f"bundle digest <code>{e(m.get('bundle_digest', '?'))}</code></p>")
    parts.append(_table(["file", "role", "HTP", "size", "sha256"],
                        [[f.name, f.role or "-", f.htp_arch or "-", "-" if f.size is None else f.size,
                          f.sha256] for f in q.manifest]) if q.manifest else '<p class="note">not recorded</p>')
    parts.append("<h2>All tests</h2>")
    parts.append(_table(["SoC", "device", "suite", "test", "outcome", "attempts", "time (s)"],
                        [[td(r.soc or "-"), td(r.serial or "-"), td(r.suite), f'<td class="mono">{e(r.name)}</td>',
                          _outcome_td(r.outcome, r.error_kind), td(len(r.attempts) + 1, "num"),
                          td(f"{r.duration_s:.1f}", "num")] for r in q.records], raw=True))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
