"""The release qualification report's content: the view model every format renders.

``QualificationReport`` is what a release manager reads, whatever the format: the verdict first, the SoC x
suite matrix, correctness per SoC/mode/seq_len/prompt with the first divergence, throughput per point
with the regression gate's verdict, the devices, the infrastructure events, the bundle's manifest.
``farm.report.html`` renders it as a page, ``farm.report.markdown`` as Markdown (a CI step summary, a
release ticket), ``farm.report.benchmark_v3`` as records of the PyTorch benchmark database.

Errors are errors, failures are failures, everywhere: an infrastructure error is never counted, shown
or worded as a failure of the code under test.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from farm.exitcodes import ExitCode
from farm.results.gate import GateResult, GateVerdict, PointResult, evaluate, exit_code
from farm.report.units import UnitOutcomes, UnitSpread, unit_outcomes, unit_spreads
from farm.results.records import QualificationResults, TestRecord, verdict
from farm.vocab import ErrorKind, Outcome, Timing

HEADLINES = {
    ExitCode.OK: ("PASS", "every test passed and no throughput regressed"),
    ExitCode.TEST_FAILURE: ("FAIL", "the code under test failed (see Failures)"),
    ExitCode.REGRESSION: ("REGRESSION", "every test passed, but the regression gate failed against the "
                                        "baseline"),
    ExitCode.BAD_INPUT: ("BAD INPUT", "some tests could not run as asked (see Errors)"),
    ExitCode.INFRA: ("INFRA ERROR", "no failure, but the infrastructure kept some tests from a verdict "
                                    "(see Errors)"),
    ExitCode.INTERRUPTED: ("INTERRUPTED", "the run was interrupted: this report is partial"),
}
# Every document of a run (report.html, report.md, summary.md) is titled the same way, in words.
TITLE = "Qualification of {bundle}"
SUITE_NAMES = {"test_smoke": "smoke", "test_correctness": "correctness", "test_throughput": "throughput"}
DIVERGENCE = re.compile(r"diverge at (token ids|output text) index (\d+)")


@dataclass
class CorrectnessRow:
    soc: str
    serial: str
    test: str       # updaters_agree, matches_golden
    mode: str
    seq_len: str
    case: str       # the case (prompt) name of suites/data/correctness.toml
    outcome: Outcome
    first_divergence: str  # "token 3", "text byte 17", "-" when they agree, "" when unknown
    message: str
    error_kind: ErrorKind | None = None


@dataclass
class DeviceRow:
    serial: str
    soc: str
    model: str = ""
    android: str = ""
    htp_arch: str = ""
    virtual: bool | None = None
    timing: str = ""  # farm.vocab.Timing; "" in runs stored before it was recorded

    @property
    def figures(self) -> str:
        """Where this device's figures come from, as the reports say it."""
        timing = self.timing or {True: Timing.HOST_CPU, False: Timing.MEASURED}.get(self.virtual, "")
        return Timing(timing).figures if timing in set(Timing) else "?"


@dataclass
class InfraEvent:
    at: str
    serial: str
    kind: str
    reason: str
    test: str = ""


@dataclass
class ManifestFile:
    name: str
    sha256: str
    size: int | None
    role: str
    htp_arch: str = ""


@dataclass
class QualificationReport:
    run: QualificationResults
    baseline: QualificationResults | None
    gate: GateResult
    notes: list[str] = field(default_factory=list)
    # Each point's throughput over the history of runs of this purpose and bundle (farm/report/trends.py);
    # empty when the run was not stored or no history was asked for.
    trends: list = field(default_factory=list)
    trends_of: str = ""  # which history: "the last N nightly runs of BUNDLE"

    @property
    def meta(self) -> dict[str, Any]:
        return self.run.meta

    @property
    def records(self) -> list[TestRecord]:
        return self.run.records

    @property
    def stopped(self) -> str | None:
        """Why the farm stopped the run before its end (a lost pool), or None."""
        return self.meta.get("stopped") or None

    @property
    def partial(self) -> bool:
        return bool(self.meta.get("interrupted") or self.meta.get("partial"))

    @property
    def interrupted(self) -> bool:
        """Partial because someone stopped it (or a recovered journal: who stopped it is unknown);
        a run the farm stopped itself is an infrastructure verdict, not an interruption."""
        return bool(self.meta.get("interrupted")) or (self.partial and not self.stopped)

    @property
    def run_verdict(self) -> str:
        return self.meta.get("verdict") or verdict(self.records, interrupted=self.interrupted).value

    @property
    def exit_code(self) -> ExitCode:
        return exit_code(self.run_verdict, self.gate, interrupted=self.interrupted)

    @property
    def headline(self) -> tuple[str, str]:
        title, why = HEADLINES[self.exit_code]
        n = self.gate.count("inconclusive")
        if n and not self.gate.failed and self.exit_code != ExitCode.INTERRUPTED:
            why += f"; the regression gate is inconclusive on {n} point(s): more measured runs needed"
        if self.stopped and not self.interrupted:
            why += f"; the run stopped before its end ({self.stopped}): this report is partial"
        return title, why

    def count(self, outcome: Outcome) -> int:
        return sum(r.outcome == outcome for r in self.records)

    @property
    def failures(self) -> list[TestRecord]:
        return [r for r in self.records if r.outcome == Outcome.FAILED]

    @property
    def errors(self) -> list[TestRecord]:
        return [r for r in self.records if r.outcome == Outcome.ERROR]

    # -- SoC x suite ------------------------------------------------------------------------------
    @property
    def socs(self) -> list[str]:
        return sorted({r.soc or "no SoC" for r in self.records})

    @property
    def suites(self) -> list[str]:
        return sorted({suite_name(r) for r in self.records})

    def cell(self, soc: str, suite: str) -> Counter:
        return Counter(r.outcome for r in self.records
                       if (r.soc or "no SoC") == soc and suite_name(r) == suite)

    # -- sections ---------------------------------------------------------------------------------
    @property
    def correctness(self) -> list[CorrectnessRow]:
        """The correctness rows in the order every format lists them (``correctness_order``)."""
        return sorted((correctness_row(r) for r in self.records if r.suite == "test_correctness"),
                      key=correctness_order)

    @property
    def throughput(self) -> list[PointResult]:
        return self.gate.points

    @property
    def devices(self) -> list[DeviceRow]:
        return devices_of(self.run)

    @property
    def infra_events(self) -> list[InfraEvent]:
        return infra_events_of(self.run)

    @property
    def manifest(self) -> list[ManifestFile]:
        return manifest_of(self.run)

    # -- units of a SoC (--farm-dist each) ------------------------------------------------------
    @property
    def unit_spreads(self) -> list[UnitSpread]:
        return unit_spreads(self.records, min_effect=self.gate.config.min_effect)

    @property
    def unit_outcomes(self) -> list[UnitOutcomes]:
        return unit_outcomes(self.records)

    @property
    def unit_notes(self) -> list[str]:
        """One line per outlier unit and per unit that failed where another of its SoC passed."""
        notes = []
        for p in self.unit_spreads:
            for f in p.outliers:
                notes.append(f"outlier unit {f.serial} of {p.soc}: {f.delta:+.1%} {p.metric} against the "
                             f"median of its SoC's {len(p.figures)} units ({p.test}, {p.updater} "
                             f"{p.mode} {p.seq_len})")
        for u in self.unit_outcomes:
            for serial in u.odd:
                notes.append(f"unit {serial} of {u.soc}: {u.outcomes[serial]} on {u.test}, which passed on "
                             f"{', '.join(s for s, o in u.outcomes.items() if o == Outcome.PASSED)}")
        return notes


def document_title(bundle: Any = None, verdict_word: str = "") -> str:
    """A run's documents' title, in words: "Qualification of BUNDLE: VERDICT" (no bundle known:
    "Qualification: VERDICT"; no verdict: just the first part, as the page's heading reads)."""
    head = TITLE.format(bundle=bundle) if bundle not in (None, "") else "Qualification"
    return f"{head}: {verdict_word}" if verdict_word else head


def qualification_report(run: QualificationResults, baseline: QualificationResults | None = None, gate: GateResult | None = None,
                  **gate_config) -> QualificationReport:
    """The report's content for ``run`` (against ``baseline``; the gate is evaluated unless given)."""
    if gate is None:
        from farm.results.gate import GateConfig

        gate = evaluate(run, baseline, GateConfig(**gate_config))
    return QualificationReport(run, baseline, gate)


# -- extraction ---------------------------------------------------------------------------------------

def suite_name(record: TestRecord) -> str:
    return SUITE_NAMES.get(record.suite, record.suite)


def _param_id(record: TestRecord) -> str:
    name = record.name
    return name[name.index("[") + 1:-1] if "[" in name and name.endswith("]") else ""


def correctness_row(record: TestRecord) -> CorrectnessRow:
    props = record.properties
    mode, seq_len = props.get("mode", ""), props.get("seq_len", "")
    # The point id is "<SoC>[-<unit>]-<mode>-<case>[-<seq_len>]"; the suite records no case name of its own.
    case = props.get("case") or _param_id(record)
    for prefix in (f"{record.soc}-", f"{props.get('unit', '')}-", f"{mode}-"):
        if prefix != "-" and case.startswith(prefix):
            case = case[len(prefix):]
    if seq_len and case.endswith(f"-{seq_len}"):
        case = case[:-len(seq_len) - 1]
    divergence = props.get("first_divergence", "")
    if not divergence:
        m = DIVERGENCE.search(record.message)
        if m:
            divergence = f"{'token' if m.group(1) == 'token ids' else 'text byte'} {m.group(2)}"
        elif "produced no" in record.message:
            divergence = "empty output"
        elif record.outcome == Outcome.PASSED:
            divergence = "-"
    return CorrectnessRow(record.soc or "", record.serial or "", record.name.partition("[")[0]
                          .removeprefix("test_"), mode, seq_len, case, record.outcome, divergence,
                          record.message, record.error_kind)


# Not passed first (failed, then errors, then skipped), then by SoC, by case (prompt), and the rest for
# a stable order.
OUTCOME_ORDER = {Outcome.FAILED: 0, Outcome.ERROR: 1, Outcome.SKIPPED: 2, Outcome.PASSED: 3}


def _natural(text: str) -> tuple[int, int, str]:
    """Numbers as numbers ("64" before "128"), then text."""
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def correctness_order(row: CorrectnessRow) -> tuple:
    """Where ``row`` goes in the correctness table: whatever did not pass first (failures before
    errors before skips), then by SoC, then by case (prompt), then test, mode, seq_len and device."""
    return (OUTCOME_ORDER.get(row.outcome, 0), row.soc, row.case, row.test, row.mode, _natural(row.seq_len),
            row.serial)


def devices_of(run: QualificationResults) -> list[DeviceRow]:
    """meta.devices when the run recorded them; otherwise what the records say of their devices."""
    listed = run.meta.get("devices")
    if isinstance(listed, list) and listed:
        out = []
        for i, d in enumerate(listed):
            if not isinstance(d, dict) or "serial" not in d:
                raise ValueError(f"run {run.meta.get('run_id', '?')}: meta.devices[{i}] is not a device "
                                 f"with a serial: {d!r}")
            out.append(DeviceRow(str(d["serial"]), str(d.get("soc") or ""), str(d.get("model") or ""),
                              str(d.get("android") or ""), str(d.get("htp_arch") or ""), d.get("virtual"),
                              str(d.get("timing") or "")))
        return sorted(out, key=lambda d: (d.soc, d.serial))
    seen: dict[str, DeviceRow] = {}
    for r in run.records:
        if r.serial and r.serial not in seen:
            virtual = r.properties.get("virtual")
            seen[r.serial] = DeviceRow(r.serial, r.soc or "", htp_arch=r.properties.get("htp_arch", ""),
                                    virtual=run.meta.get("virtual") if virtual is None else virtual == "true",
                                    timing=r.properties.get("timing", ""))
    return sorted(seen.values(), key=lambda d: (d.soc, d.serial))


def infra_events_of(run: QualificationResults) -> list[InfraEvent]:
    """The run's infrastructure events (meta.infra_events: re-leases, quarantines) and every spoiled
    attempt of a test, oldest first where a time is known."""
    events = []
    for e in run.meta.get("infra_events") or []:
        if isinstance(e, dict):
            events.append(InfraEvent(str(e.get("at", "")), str(e.get("serial") or ""),
                                     str(e.get("kind", "")), str(e.get("reason", ""))))
    for r in run.records:
        for a in r.attempts:
            events.append(InfraEvent("", a.serial or "", "spoiled attempt", a.reason, r.name))
    return events


def manifest_of(run: QualificationResults) -> list[ManifestFile]:
    """meta.manifest as a list of files; a path (older results) is read if it is still there."""
    raw = run.meta.get("manifest")
    if isinstance(raw, str) and raw:
        try:
            raw = json.loads(Path(raw).read_text()).get("files", [])
        except (OSError, ValueError, AttributeError):
            return []
    if not isinstance(raw, list):
        return []
    files = []
    for f in raw:
        if isinstance(f, dict) and "name" in f:
            files.append(ManifestFile(str(f["name"]), str(f.get("sha256", "")), f.get("size"),
                                      str(f.get("role", "")), str(f.get("htp_arch") or "")))
    return files


# -- formatting shared with the HTML ------------------------------------------------------------------

def fmt_num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def fmt_p(value: float | None) -> str:
    return "-" if value is None else (f"{value:.3f}" if value >= 0.001 else f"{value:.1e}")


def cell_text(counts: Counter) -> str:
    if not counts:
        return "-"
    order = [(Outcome.PASSED, "passed"), (Outcome.FAILED, "failed"), (Outcome.ERROR, "error"),
             (Outcome.SKIPPED, "skipped")]
    return ", ".join(f"{counts[o]} {word}{'s' if o == Outcome.ERROR and counts[o] > 1 else ''}"
                     for o, word in order if counts[o])


def error_label(record: TestRecord | CorrectnessRow) -> str:
    return "bad input" if record.error_kind == ErrorKind.USAGE else "infrastructure error"


def outcome_label(outcome: Outcome, error_kind: ErrorKind | None = None) -> str:
    if outcome == Outcome.ERROR:
        return "error (bad input)" if error_kind == ErrorKind.USAGE else "error (infrastructure)"
    return str(outcome)


def facts(q: QualificationReport) -> list[tuple[str, str]]:
    """(label, value) of the run, in the order a reader wants them."""
    m = q.meta
    digest = str(m.get("bundle_digest") or "")
    base = q.baseline.meta if q.baseline is not None else None
    return [
        ("run", str(m.get("run_id", "?"))),
        ("purpose", str(m.get("purpose") or "-")),
        ("bundle", f"{m.get('bundle_name', '?')} (sha256 {digest[:16] or '?'})"),
        ("runner dialect", str(m.get("runner_dialect") or "?")),
        ("git revision", str(m.get("git_revision") or "unknown")),
        ("started / ended", f"{m.get('started_at', '?')} / {m.get('ended_at') or m.get('written_at') or '?'}"),
        ("wall time", f"{float(m.get('wall_s') or 0):.1f} s"),
        ("devices", f"{len(q.devices)}" + (f" (figures: {', '.join(sorted({d.figures for d in q.devices}))})"
                                           if q.devices else "")),
        ("tests", f"{len(q.records)}: {q.count(Outcome.PASSED)} passed, {q.count(Outcome.FAILED)} failed, "
                  f"{q.count(Outcome.ERROR)} errors, {q.count(Outcome.SKIPPED)} skipped"),
        ("baseline", "none" if base is None else
         f"{base.get('run_id', '?')}" + (f" ({base['baseline_name']})" if base.get("baseline_name") else "")
         + f", bundle {base.get('bundle_name', '?')}"),
        ("tool version", str(m.get("tool_version") or "-")),
        *((("shards", shards_line(m["group"])),) if isinstance(m.get("group"), dict) else ()),
    ]


def shards_line(group: dict[str, Any]) -> str:
    """A group run's shards: which ran (their runs and verdicts) and which are missing; a shard's own
    run says which part of which group it is."""
    if not group.get("merged"):
        return f"shard {group.get('shard')}/{group.get('of')} of group {group.get('id')} (by {group.get('by')})"
    parts = [f"{s['shard']}/{group['of']} run {s.get('run_id')} ({s.get('verdict')}"
             + (f", {s['unfinished']} test(s) without a result" if s.get("unfinished") else "") + ")"
             for s in group.get("shards", [])]
    parts += [f"{i}/{group['of']} MISSING" for i in group.get("missing", [])]
    return f"group {group.get('id')}: " + "; ".join(parts)


def gate_line(q: QualificationReport) -> str:
    g = q.gate
    c = g.config
    if g.verdict == GateVerdict.NO_BASELINE:
        return "no baseline: throughput is checked against the thresholds only"
    counts = ", ".join(f"{g.count(v)} {v}" for v in ("regressed", "inconclusive", "improved", "unchanged",
                                                          "new") if g.count(v))
    rule = (f"Mann-Whitney U two-sided, p < {c.alpha:g}, effect >= {c.min_effect * 100:g}%, "
            f"inconclusive {'fails' if c.inconclusive_fails else 'passes'}")
    return f"{g.verdict}{' (FAILS)' if g.failed else ''}: {counts or 'no points'} ({rule})"


# -- a failed test's evidence, excerpted ---------------------------------------------------------------
# The files are farm.device.evidence's, in the report directory: what a person reads first of each is
# shown on the page, bounded (a file may be missing, huge, or not UTF-8), with a link to all of it.

EXCERPT_READ_BYTES = 2 << 20   # read of any one file: its end (logcat, runner output), its head (tombstone)
EXCERPT_CONTEXT = (8, 12)      # lines kept before and after a line that looks like the crash
EXCERPT_LINES = 80             # at most, of a logcat excerpt
EXCERPT_TAIL_LINES = 40        # of a logcat where no line looks like a crash
STDERR_TAIL_LINES = 30
TOMBSTONE_FRAMES = 12          # of the backtrace
EXCERPT_LINE_CHARS = 400       # a line longer than this is cut
EXCERPT_CHARS = 24_000         # an excerpt longer than this is cut

# A logcat line of the crash: priority F (fatal) or A (assert) in threadtime, or the words of one.
_FATAL_PRIORITY = re.compile(r"^\d\d-\d\d \d\d:\d\d:\d\d\.\d+\s+\d+\s+\d+\s+[FA]\s")
_CRASH_WORDS = re.compile(r"fatal|abort|\bSIG(?:SEGV|ABRT|BUS|ILL|FPE|TRAP|SYS)\b|killed by signal"
                          r"|beginning of crash|tombstone written|\bcrash|panic|terminating with uncaught",
                          re.I)
_TOMBSTONE_HEAD = re.compile(r"(?:^|\s)(?:Cmdline: |pid: \d+|signal \d+ \(|Abort message: |Cause: )")
_FRAME = re.compile(r"#\d+ pc ")
_RUNNER_FILE = re.compile(r"runner-(\d+)\.txt")
_EXIT_CODE = re.compile(r"^exit code: (-?\d+)$", re.M)


@dataclass(frozen=True)
class EvidenceExcerpt:
    """What a person reads first of one evidence file: ``text`` (plain, to be escaped by the format)
    under ``title``; ``path`` is the whole file, relative to the report directory."""

    kind: str   # logcat, tombstone, stderr
    path: str
    title: str
    text: str


def safe_evidence_path(path: str) -> bool:
    """A record's evidence path that may be linked and read: plain and relative (a record is data: no
    absolute path, no ``..``, no backslash; a link quotes it, so no scheme either)."""
    parts = PurePosixPath(path).parts
    return bool(parts) and not path.startswith("/") and ".." not in parts and "\\" not in path


def _read(root: Path, path: str, *, tail: bool) -> tuple[str, bool] | None:
    """The file's text (its last or first ``EXCERPT_READ_BYTES``, undecodable bytes replaced) and whether
    it was cut; None when it is not a regular file inside ``root``."""
    try:
        base = root.resolve()
        full = (base / path).resolve()
        if not full.is_relative_to(base) or not full.is_file():
            return None
        with open(full, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            cut = size > EXCERPT_READ_BYTES
            if cut and tail:
                f.seek(size - EXCERPT_READ_BYTES)
            data = f.read(EXCERPT_READ_BYTES)
    except (OSError, ValueError):
        return None
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
    if cut and tail:
        text = text.partition("\n")[2]  # the first line read is a part of one
    return text, cut


def _bounded(lines: list[str]) -> str:
    out, total = [], 0
    for line in lines:
        line = line if len(line) <= EXCERPT_LINE_CHARS else line[:EXCERPT_LINE_CHARS] + " [... line cut]"
        total += len(line) + 1
        if total > EXCERPT_CHARS:
            out.append("[... cut: the excerpt is bounded; the whole file is linked]")
            break
        out.append(line)
    return "\n".join(out)


def logcat_excerpt(text: str) -> tuple[str, str]:
    """(what the excerpt is, its lines): the lines around those that look like the crash (fatal or
    assert priority first; else lines naming a fatal error, an abort, a signal, a crash), else the last
    ``EXCERPT_TAIL_LINES``."""
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if _FATAL_PRIORITY.match(line)] \
        or [i for i, line in enumerate(lines) if _CRASH_WORDS.search(line)]
    if not hits:
        kept = lines[-EXCERPT_TAIL_LINES:]
        return f"the last {len(kept)} of {len(lines)} lines (none looks like a crash)", _bounded(kept)
    before, after = EXCERPT_CONTEXT
    ranges: list[list[int]] = []
    for i in hits:
        lo, hi = max(0, i - before), min(len(lines), i + after + 1)
        if ranges and lo <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], hi)
        else:
            ranges.append([lo, hi])
    out: list[str] = []
    shown = last = 0
    for k, (lo, hi) in enumerate(ranges):
        if shown >= EXCERPT_LINES:
            out.append(f"[... {len(ranges) - k} more part(s) near crash lines: see the whole file]")
            last = len(lines)
            break
        hi = min(hi, lo + EXCERPT_LINES - shown)
        if lo > last:
            out.append(f"[... {lo - last} line(s) ...]")
        out += lines[lo:hi]
        shown, last = shown + hi - lo, hi
    if last < len(lines):
        out.append(f"[... {len(lines) - last} line(s) ...]")
    return f"{shown} of {len(lines)} lines, around the crash", _bounded(out)


def tombstone_summary(text: str) -> str:
    """A tombstone's (or the crash buffer's) lines a person reads first: the process, the signal, the
    abort message, the head of the backtrace; its first lines when none of them is found."""
    lines = text.splitlines()
    out = [line for line in lines if _TOMBSTONE_HEAD.search(line)]
    for i, line in enumerate(lines):
        if line.rstrip().endswith("backtrace:"):
            frames = [f for f in lines[i + 1:i + 1 + 4 * TOMBSTONE_FRAMES] if _FRAME.search(f)]
            out += ["backtrace:", *frames[:TOMBSTONE_FRAMES]]
            break
    return _bounded(out or lines[:20])


def _stderr_tail(text: str) -> tuple[str, str]:
    """A runner-N.txt (farm.device.evidence.runner_text): (its exit code line, the tail of its stderr)."""
    code = _EXIT_CODE.search(text)
    _, marker, stderr = text.rpartition("--- stderr ---\n")
    if not marker:
        stderr = text  # the marker was beyond what was read: the tail is stderr
    lines = stderr.rstrip("\n").splitlines()
    tail = lines[-STDERR_TAIL_LINES:]
    return (f"exit code {code.group(1)}" if code else "exit code ?"), \
        _bounded(tail) if tail else "(stderr was empty)"


def evidence_excerpts(record: TestRecord, report_dir: str | os.PathLike) -> tuple[list[EvidenceExcerpt],
                                                                                 list[str]]:
    """The excerpts of ``record``'s evidence files in ``report_dir`` (a logcat excerpt, a summary of
    each tombstone or of the crash buffer, the tail of the runner's stderr: its last invocation that
    failed, else its last), and the evidence files that are not there."""
    root = Path(report_dir)
    out: list[EvidenceExcerpt] = []
    missing: list[str] = []
    runners: list[tuple[int, str, str]] = []  # (N, path, text)
    for path in record.evidence:
        if not safe_evidence_path(path):
            continue
        name = PurePosixPath(path).name
        runner = _RUNNER_FILE.fullmatch(name)
        if name == "logcat.txt" or runner or "stderr" in name:
            kind = "logcat" if name == "logcat.txt" else "stderr"
            tail = True
        elif name.startswith("tombstone") or name == "crash.txt":
            kind, tail = "tombstone", False
        else:
            continue  # battery, thermal, capture warnings: linked, not excerpted
        read = _read(root, path, tail=tail)
        if read is None:
            missing.append(path)
            continue
        text, cut = read
        if kind == "logcat":
            what, excerpt = logcat_excerpt(text)
            out.append(EvidenceExcerpt(kind, path, f"logcat excerpt: {what}"
                                       + (f" (of its last {EXCERPT_READ_BYTES >> 20} MiB)" if cut else ""), excerpt))
        elif kind == "tombstone":
            what = "crash buffer summary" if name == "crash.txt" else f"tombstone summary ({name})"
            out.append(EvidenceExcerpt(kind, path, f"{what}: signal, abort message, backtrace",
                                       tombstone_summary(text)))
        elif runner:
            runners.append((int(runner.group(1)), path, text))
        else:
            lines = text.rstrip("\n").splitlines()
            out.append(EvidenceExcerpt(kind, path, f"stderr ({name}): the last {min(len(lines), STDERR_TAIL_LINES)} "
                                       "lines", _bounded(lines[-STDERR_TAIL_LINES:]) or "(empty)"))
    if runners:
        runners.sort()
        failed = [r for r in runners if (m := _EXIT_CODE.search(r[2])) and m.group(1) != "0"]
        n, path, text = (failed or runners)[-1]
        code, tail = _stderr_tail(text)
        out.append(EvidenceExcerpt("stderr", path, f"runner stderr: the last lines (invocation {n} of "
                                   f"{len(runners)}, {code})", tail))
    order = {"logcat": 0, "tombstone": 1, "stderr": 2}
    out.sort(key=lambda x: order[x.kind])
    return out, missing
