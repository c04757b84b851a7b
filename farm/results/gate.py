"""The regression gate: a run's raw throughput samples against a baseline run's, point by point.

A point is (SoC, metric, mode, seq_len, updater). Every measured run of a point on every device of that
SoC is pooled (devices of one SoC are the same hardware class; the gate is per SoC, not per phone).

Why Mann-Whitney U, and why two-sided: phones and hosts are noisy and their samples are not normal
(thermal steps, a background task: long tails, a few outliers), so a rank test on the raw samples is
used, as asv and Chromium's Pinpoint do. The test is two-sided because the gate gives both directions
(``regressed`` and ``improved``): one two-sided test at ``alpha`` keeps the chance of calling either
change on identical distributions at ``alpha``, where a one-sided "slower" test would need a second
one for "faster". The direction then comes from the medians. A p-value alone is not a verdict: with
many samples a 0.5% shift is "significant", so a minimum effect size (relative change of the median,
default 5%) must also be passed.

Verdicts, precisely (``d`` = relative median change now vs baseline, ``p`` = two-sided p-value):

- ``new``: the baseline has no samples at this point; nothing to compare (never fails the gate).
- ``inconclusive`` (too few samples): with n and m samples the smallest p-value the exact test can
  give is 2 / C(n+m, n); when that is not below ``alpha``, no data could ever be significant (3 vs 3:
  0.1). Ask for more runs.
- ``unchanged``: |d| < min_effect, whatever p says (a real shift smaller than the effect size is
  below what the gate is for); also when the medians are equal (d = 0), even with min_effect 0: with
  no change of the median there is no direction to call. From a baseline median of 0, any other median
  is a change of unbounded size (d = +-inf).
- ``regressed`` / ``improved``: p < alpha and |d| >= min_effect, slower / faster.
- ``inconclusive`` (noisy): |d| >= min_effect but p >= alpha: the medians differ by more than the
  effect size, yet the samples overlap too much to say it is not noise (Pinpoint's "unknown").

The plain threshold rule (a minimum median per point, from the suites' thresholds files) stays: it is
the throughput suite's own assertion, and is shown beside the gate's verdict for each point.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from enum import StrEnum

from farm.errors import UsageError
from farm.exitcodes import ExitCode, for_verdict
from farm.results.records import Measurement, QualificationResults, TestRecord
from farm.vocab import Outcome, Timing, Verdict

__all__ = ["GateConfig", "GateResult", "GateVerdict", "PointKey", "PointResult", "PointVerdict",
           "compare_samples", "evaluate", "exit_code", "figure_timings", "measurements_of", "min_p_value",
           "point_key", "points_of"]

# Units where a smaller number is better; everything else (tok/s) is better when larger.
LOWER_IS_BETTER_UNITS = frozenset({"ms", "s"})


class PointVerdict(StrEnum):
    REGRESSED = "regressed"
    IMPROVED = "improved"
    UNCHANGED = "unchanged"
    INCONCLUSIVE = "inconclusive"
    NEW = "new"


class GateVerdict(StrEnum):
    """The whole run's gate: ``pass``, ``regressed``, ``inconclusive`` or ``no-baseline``."""

    PASS = "pass"
    REGRESSED = "regressed"
    INCONCLUSIVE = "inconclusive"
    NO_BASELINE = "no-baseline"


@dataclass(frozen=True)
class GateConfig:
    alpha: float = 0.05
    min_effect: float = 0.05        # relative change of the median, 0.05 = 5%
    inconclusive_fails: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise UsageError(f"gate alpha must be in (0, 1), got {self.alpha}")
        if not (math.isfinite(self.min_effect) and 0 <= self.min_effect < 1):
            raise UsageError(f"gate minimum effect must be in [0, 100) %, got {self.min_effect * 100:g}%")


@dataclass(frozen=True, order=True)
class PointKey:
    """One point the gate compares. Its timing (farm.vocab.Timing: measured, host-cpu, simulated;
    "" where no device told it) is part of it: a simulated phone's figures, a virtual device's host
    CPU and a phone's measurement are three points, never pooled or compared with one another."""

    soc: str
    metric: str
    mode: str
    seq_len: int
    updater: str
    timing: str = ""

    def __str__(self) -> str:
        return f"{self.soc} {self.mode}/{self.seq_len}/{self.updater} {self.metric}" + \
            (f" ({self.timing})" if self.timing and self.timing != Timing.MEASURED else "")


def point_key(record: TestRecord, m: Measurement) -> PointKey:
    """The point of measurement ``m`` of ``record``: its own timing, else the device's the record
    names (runs stored before measurements carried one)."""
    return PointKey(record.soc or "?", m.metric, m.mode, m.seq_len, m.updater,
                    m.timing or record.properties.get("timing", ""))


@dataclass
class Samples:
    """One point's pooled samples in one run."""

    unit: str
    values: list[float] = field(default_factory=list)
    threshold: float | None = None
    serials: set[str] = field(default_factory=set)
    conditions: list[dict] = field(default_factory=list)  # one per value ({} where none was kept)


@dataclass
class PointResult:
    key: PointKey
    unit: str
    now: list[float]
    base: list[float] | None
    verdict: PointVerdict
    reason: str
    p_value: float | None = None
    threshold: float | None = None
    serials: list[str] = field(default_factory=list)
    conditions: list[dict] = field(default_factory=list)  # this run's, one per value of ``now``

    @property
    def now_median(self) -> float:
        return statistics.median(self.now)

    @property
    def base_median(self) -> float | None:
        return statistics.median(self.base) if self.base else None

    @property
    def delta(self) -> float | None:
        """Relative change of the median, now vs baseline (0.1 = 10% more). The gate's effect size."""
        base = self.base_median
        return None if not base else (self.now_median - base) / base

    @property
    def prob_greater(self) -> float | None:
        """P(a sample of now > a sample of the baseline), ties half: the common-language effect size
        (0.5 = no difference)."""
        if not self.base:
            return None
        wins = sum((x > y) + 0.5 * (x == y) for x in self.now for y in self.base)
        return wins / (len(self.now) * len(self.base))

    @property
    def threshold_ok(self) -> bool | None:
        if self.threshold is None:
            return None
        lower = self.unit in LOWER_IS_BETTER_UNITS
        return self.now_median <= self.threshold if lower else self.now_median >= self.threshold


@dataclass
class GateResult:
    config: GateConfig
    points: list[PointResult]
    baseline_id: str | None
    notes: list[str] = field(default_factory=list)  # e.g. the baseline is of another bundle

    @property
    def verdict(self) -> GateVerdict:
        if self.baseline_id is None:
            return GateVerdict.NO_BASELINE
        verdicts = {p.verdict for p in self.points}
        if PointVerdict.REGRESSED in verdicts:
            return GateVerdict.REGRESSED
        if PointVerdict.INCONCLUSIVE in verdicts:
            return GateVerdict.INCONCLUSIVE
        return GateVerdict.PASS

    @property
    def failed(self) -> bool:
        v = self.verdict
        return v == GateVerdict.REGRESSED or (v == GateVerdict.INCONCLUSIVE
                                              and self.config.inconclusive_fails)

    def count(self, verdict: PointVerdict) -> int:
        return sum(p.verdict == verdict for p in self.points)


# -- samples of a run ---------------------------------------------------------------------------------

def _numbers(text: str, where: str) -> list[float]:
    try:
        values = [float(v) for v in text.split()]
    except ValueError:
        raise UsageError(f"{where}: {text!r} is not a list of numbers") from None
    if not all(math.isfinite(v) for v in values):
        raise UsageError(f"{where}: {text!r} holds a value that is not finite")
    return values


def measurements_of(record: TestRecord, run_id: str = "?") -> list[Measurement]:
    """The record's measurements; for records written before the suites recorded ``Measurement``s,
    rebuilt from the throughput suite's properties (``tok_s_runs.<updater>``, mode, seq_len,
    ``threshold_tok_s``)."""
    if record.measurements:
        return record.measurements
    runs = {k.removeprefix("tok_s_runs."): v for k, v in record.properties.items()
            if k.startswith("tok_s_runs.")}
    if not runs:
        return []
    where = f"run {run_id}: record {record.nodeid}"
    mode = record.properties.get("mode", "")
    try:
        seq_len = int(record.properties.get("seq_len", "0"))
    except ValueError:
        raise UsageError(f"{where}: property seq_len {record.properties['seq_len']!r} is not an "
                         "integer") from None
    threshold = None
    if "threshold_tok_s" in record.properties and len(runs) == 1:  # the minimum is for its one updater
        [threshold] = _numbers(record.properties["threshold_tok_s"], f"{where}: property threshold_tok_s")
    return [Measurement("tok_s", "tok/s", _numbers(text, f"{where}: property tok_s_runs.{updater}"),
                        updater=updater, mode=mode, seq_len=seq_len, threshold=threshold)
            for updater, text in sorted(runs.items())]


def points_of(run: QualificationResults) -> dict[PointKey, Samples]:
    """Every point of the run with its pooled samples. Records that erred are left out: the farm could
    not vouch for what they measured (an infrastructure error is never evidence of speed)."""
    run_id = str(run.meta.get("run_id", "?"))
    points: dict[PointKey, Samples] = {}
    for record in run.records:
        if record.outcome not in (Outcome.PASSED, Outcome.FAILED):
            continue
        for m in measurements_of(record, run_id):
            if not m.values:
                continue
            key = point_key(record, m)
            samples = points.setdefault(key, Samples(unit=m.unit))
            if samples.unit != m.unit:
                raise UsageError(f"run {run_id}: {key} measured in {samples.unit!r} and {m.unit!r}")
            samples.values.extend(float(v) for v in m.values)
            samples.conditions.extend(m.conditions if len(m.conditions) == len(m.values) else [{}] * len(m.values))
            if m.threshold is not None:
                samples.threshold = m.threshold
            if record.serial:
                samples.serials.add(record.serial)
    return points


def figure_timings(run: QualificationResults) -> frozenset[str]:
    """The timings of the run's figures (farm.vocab.Timing values; "" for figures no device told)."""
    return frozenset(key.timing for key in points_of(run))


# -- the comparison -----------------------------------------------------------------------------------

def min_p_value(n: int, m: int) -> float:
    """The smallest two-sided p-value the exact Mann-Whitney test can give with n and m samples (all
    of one side above all of the other, no ties)."""
    return min(1.0, 2.0 / math.comb(n + m, n))


def _runs_needed(alpha: float) -> int:
    n = 2
    while min_p_value(n, n) >= alpha:
        n += 1
    return n


def _relative_change(now: float, base: float) -> float:
    """(now - base) / base; from a baseline median of 0 any change is unbounded (a latency that was 0 ms
    and is now 40 ms has regressed, not stayed within the effect size)."""
    if base:
        return (now - base) / base
    return 0.0 if now == 0 else math.copysign(math.inf, now)


def compare_samples(now: list[float], base: list[float], config: GateConfig = GateConfig(), *,
                    unit: str = "tok/s") -> tuple[PointVerdict, float | None, str]:
    """(verdict, two-sided p-value, why) for one point. See the module's docstring for the rules."""
    from scipy.stats import mannwhitneyu

    if not base:
        return PointVerdict.NEW, None, "no baseline samples at this point"
    if not now:
        raise ValueError("compare_samples: no samples of this run")
    delta = _relative_change(statistics.median(now), statistics.median(base))
    worse = delta > 0 if unit in LOWER_IS_BETTER_UNITS else delta < 0
    floor = min_p_value(len(now), len(base))
    if floor >= config.alpha:
        need = _runs_needed(config.alpha)
        return (PointVerdict.INCONCLUSIVE, None,
                f"{len(now)} vs {len(base)} samples can never reach p < {config.alpha:g} (best "
                f"{floor:.3g}): run at least {need} measured runs on each side")
    if len(set(now) | set(base)) == 1:
        p = 1.0  # every sample equal: no difference at all (the test itself is undefined here)
    else:
        p = float(mannwhitneyu(now, base, alternative="two-sided", method="auto").pvalue)
    size = f"median {delta * 100:+.1f}%"
    if abs(delta) < config.min_effect or delta == 0:  # equal medians: no direction to call, even at 0%
        return PointVerdict.UNCHANGED, p, f"{size}, within the {config.min_effect * 100:g}% effect size"
    if p < config.alpha:
        verdict = PointVerdict.REGRESSED if worse else PointVerdict.IMPROVED
        return verdict, p, f"{size}, p = {p:.3g} < {config.alpha:g}"
    return (PointVerdict.INCONCLUSIVE, p,
            f"{size} but p = {p:.3g} >= {config.alpha:g}: too noisy to tell, run more")


def evaluate(run: QualificationResults, baseline: QualificationResults | None, config: GateConfig = GateConfig()) -> GateResult:
    """The gate for ``run`` against ``baseline`` (None: no baseline, every point ``new``)."""
    now_points = points_of(run)
    base_points = points_of(baseline) if baseline is not None else {}
    notes = []
    if baseline is not None:
        for key, what in (("bundle_name", "bundle"), ("runner_dialect", "runner dialect"),
                          ("virtual", "virtual flag")):
            a, b = run.meta.get(key), baseline.meta.get(key)
            if a is not None and b is not None and a != b:
                notes.append(f"the baseline's {what} is {b!r}, this run's {a!r}")
        ours, theirs = {k.timing for k in now_points}, {k.timing for k in base_points}
        if theirs and ours and ours != theirs:
            notes.append(f"the baseline's figures are {', '.join(sorted(t or 'of unknown timing' for t in theirs))}, "
                         f"this run's {', '.join(sorted(t or 'of unknown timing' for t in ours))}: "
                         f"figures of another timing are never compared")
    results = []
    for key in sorted(now_points):
        samples = now_points[key]
        base = base_points.get(key)
        if base is not None and base.unit != samples.unit:
            raise UsageError(f"run {baseline.meta.get('run_id', '?')}: {key} is in {base.unit!r}, "
                             f"this run's in {samples.unit!r}")
        base_values = base.values if base is not None else None
        verdict, p, reason = compare_samples(samples.values, base_values or [], config, unit=samples.unit)
        results.append(PointResult(key, samples.unit, samples.values, base_values, verdict, reason, p,
                                   samples.threshold, sorted(samples.serials), samples.conditions))
    baseline_id = None if baseline is None else str(baseline.meta.get("run_id") or "baseline")
    return GateResult(config, results, baseline_id, notes)


def exit_code(run_verdict: Verdict | str, gate: GateResult | None, *, interrupted: bool = False) -> ExitCode:
    """The run's exit code: interrupted 130; a test failure 1 wins over everything measured; then a
    failed gate 4 (a regression, or an inconclusive point when those fail); then bad input 2,
    infrastructure 3; else 0. A regression outranks infrastructure errors: the tests that ran proved
    something, and an error elsewhere does not make it less true."""
    if interrupted:
        return ExitCode.INTERRUPTED
    run_verdict = Verdict(run_verdict)
    if run_verdict == Verdict.FAIL:
        return ExitCode.TEST_FAILURE
    if gate is not None and gate.failed:
        return ExitCode.REGRESSION
    return for_verdict(run_verdict)
