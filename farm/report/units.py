"""The units of a SoC side by side, for a run under ``--farm-dist each`` (every test on every device):
the spread of each throughput point across a SoC's units with an outlier unit flagged, and the tests
whose outcome differs between units of one SoC (a bad unit, or a flaky test).

A unit is an outlier when its median is off the median of the SoC's units by at least the minimum
effect and by more than three times the run-to-run noise seen within units, and fewer than half the
units are off: with one slow phone among three or more, the slow one is flagged and the others are
not. Two units can be told apart but not which one is odd, so two units give a spread and no outlier;
so do two groups of units.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from farm.results.records import TestRecord
from farm.vocab import Outcome

OUTLIER_NOISE_FACTOR = 3.0


@dataclass(frozen=True)
class UnitFigure:
    serial: str
    median: float
    n: int
    delta: float | None  # off the median of the SoC's units, as a fraction (None with fewer than 3 units)
    outlier: bool


@dataclass(frozen=True)
class UnitSpread:
    soc: str
    test: str  # the test with its unit taken out of its id
    metric: str
    unit: str
    mode: str
    seq_len: int
    updater: str
    timing: str
    figures: list[UnitFigure]

    @property
    def spread(self) -> float:
        medians = [f.median for f in self.figures]
        return max(medians) / min(medians) - 1 if min(medians) > 0 else math.inf

    @property
    def outliers(self) -> list[UnitFigure]:
        return [f for f in self.figures if f.outlier]


@dataclass(frozen=True)
class UnitOutcomes:
    """A test whose outcome was not the same on every unit of its SoC."""

    soc: str
    test: str
    outcomes: dict[str, str]  # serial -> outcome

    @property
    def odd(self) -> list[str]:
        """The units that failed or errored where another unit passed."""
        if not any(o == Outcome.PASSED for o in self.outcomes.values()):
            return []
        return sorted(s for s, o in self.outcomes.items() if o in (Outcome.FAILED, Outcome.ERROR))


def _unit(record: TestRecord) -> str | None:
    return record.properties.get("unit") or None


def unit_free_name(record: TestRecord) -> str:
    """The test's name with its unit taken out of its parameters: one name for all units."""
    unit = _unit(record)
    return record.name.replace(f"-{unit}", "", 1) if unit else record.name


def unit_spreads(records: Sequence[TestRecord], *, min_effect: float = 0.05) -> list[UnitSpread]:
    """Every measured point that ran on two or more units of a SoC, its units sorted by serial."""
    points: dict[tuple, dict[str, list[float]]] = {}
    units: dict[tuple, str] = {}
    for r in records:
        serial = _unit(r)
        if serial is None or r.outcome != Outcome.PASSED:
            continue
        for m in r.measurements:
            key = (r.soc or "?", unit_free_name(r), m.metric, m.mode, int(m.seq_len), m.updater, m.timing or "")
            points.setdefault(key, {}).setdefault(serial, []).extend(v for v in m.values if v > 0)
            units[key] = m.unit
    out = []
    for key, by_unit in sorted(points.items()):
        by_unit = {s: v for s, v in by_unit.items() if v}
        if len(by_unit) < 2:
            continue
        soc, test, metric, mode, seq_len, updater, timing = key
        out.append(UnitSpread(soc, test, metric, units[key], mode, seq_len, updater, timing,
                              _figures(by_unit, min_effect)))
    return out


def _figures(by_unit: dict[str, list[float]], min_effect: float) -> list[UnitFigure]:
    medians = {s: statistics.median(v) for s, v in by_unit.items()}
    # Run-to-run noise within a unit: the sd of its log samples, the median over the units (0 with
    # single samples). Not their mean: with a few runs a unit, one run that a background task slowed
    # (a phone's heavy tail) makes its unit's variance many times the others', and the mean of them
    # then hides a unit that is 10 % slow behind "3x the noise".
    variances = [statistics.variance([math.log(x) for x in v]) for v in by_unit.values() if len(v) > 1]
    noise = math.sqrt(statistics.median(variances)) if variances else 0.0
    # Against the median of all the SoC's units, which one odd unit cannot move (a leave-one-out
    # mean of the others can: with three units, the odd one drags the others' centre towards it).
    centre = statistics.median(medians.values())
    deltas = {s: medians[s] / centre - 1 for s in by_unit} if len(by_unit) >= 3 else {}
    odd = {s for s, d in deltas.items()
           if abs(math.log1p(d)) >= math.log1p(min_effect) and abs(math.log1p(d)) > OUTLIER_NOISE_FACTOR * noise}
    if len(odd) * 2 >= len(by_unit):  # half the units or more: two groups of units, not one odd unit
        odd = set()
    return [UnitFigure(s, medians[s], len(by_unit[s]), deltas.get(s), s in odd) for s in sorted(by_unit)]


def unit_outcomes(records: Sequence[TestRecord]) -> list[UnitOutcomes]:
    """The tests that ran on two or more units of a SoC with different outcomes."""
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for r in records:
        serial = _unit(r)
        if serial is not None:
            seen.setdefault((r.soc or "?", unit_free_name(r)), {})[serial] = Outcome(r.outcome).value
    return [UnitOutcomes(soc, test, dict(sorted(outcomes.items())))
            for (soc, test), outcomes in sorted(seen.items())
            if len(outcomes) >= 2 and len(set(outcomes.values())) > 1]
