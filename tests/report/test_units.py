"""The units of a SoC side by side (farm.report.units, --farm-dist each): the spread of a point across
units, an outlier unit flagged (and only it), a unit that fails where the others pass."""

from __future__ import annotations

import random

import pytest

from farm.report.qualification import qualification_report
from farm.report.markdown import render_markdown
from farm.report.html import render_html
from farm.report.units import unit_outcomes, unit_spreads
from farm.results.records import Measurement, QualificationResults, TestRecord
from farm.vocab import Outcome

SERIALS = ("R5CW1", "R5CW2", "R5CW3", "R5CW4")


def record(serial: str, tok_s: list[float], outcome: Outcome = Outcome.PASSED, test: str = "test_min_throughput",
           soc: str = "SM8650") -> TestRecord:
    return TestRecord(f"suites/test_throughput.py::{test}[{soc}-{serial}-hybrid-128-SmartMask]", outcome,
                      soc=soc, serial=serial, properties={"unit": serial},
                      measurements=[Measurement("tok_s", "tok/s", tok_s, "SmartMask", "hybrid", 128, None,
                                                timing="simulated")] if outcome == Outcome.PASSED else [])


def noisy(center: float, seed: int, n: int = 5, sigma: float = 0.012) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.gauss(0, sigma)) for _ in range(n)]


def test_the_one_slow_unit_among_four_is_the_outlier():
    records = [record(s, noisy(47.0 * (0.85 if s == "R5CW3" else 1.0), i)) for i, s in enumerate(SERIALS)]
    [point] = unit_spreads(records)
    assert point.test == "test_min_throughput[SM8650-hybrid-128-SmartMask]"  # one name for all units
    assert [f.serial for f in point.outliers] == ["R5CW3"]
    [slow] = point.outliers
    assert slow.delta == pytest.approx(-0.15, abs=0.03)
    assert point.spread == pytest.approx(0.176, abs=0.04)


@pytest.mark.parametrize("seed", range(20))
def test_units_within_noise_have_no_outlier(seed):
    records = [record(s, noisy(47.0, seed * 10 + i)) for i, s in enumerate(SERIALS)]
    [point] = unit_spreads(records)
    assert point.outliers == []


def test_a_difference_under_the_minimum_effect_is_no_outlier_even_without_noise():
    records = [record(s, [47.0 * (0.97 if s == "R5CW1" else 1.0)] * 3) for s in SERIALS[:3]]
    [point] = unit_spreads(records, min_effect=0.05)
    assert point.outliers == [] and point.spread == pytest.approx(1 / 0.97 - 1)
    [point] = unit_spreads(records, min_effect=0.02)
    assert [f.serial for f in point.outliers] == ["R5CW1"]


def test_two_units_give_a_spread_but_no_outlier():
    [point] = unit_spreads([record("R5CW1", [40.0] * 3), record("R5CW2", [47.0] * 3)])
    assert point.spread == pytest.approx(0.175) and point.outliers == []
    assert all(f.delta is None for f in point.figures)


def test_runs_without_units_have_no_unit_section():
    plain = record("R5CW1", [47.0])
    plain.properties = {}
    assert unit_spreads([plain, record("R5CW2", [47.0])]) == []


def test_a_unit_failing_where_the_others_pass_is_named_in_the_report():
    records = [record(s, noisy(47.0 * (0.8 if s == "R5CW2" else 1.0), i)) for i, s in enumerate(SERIALS[:3])]
    records += [record(s, [], Outcome.FAILED if s == "R5CW2" else Outcome.PASSED, test="test_updaters_agree")
                for s in SERIALS[:3]]
    [odd] = unit_outcomes(records)
    assert odd.odd == ["R5CW2"] and odd.outcomes["R5CW1"] == "passed"
    run = QualificationResults({"run_id": "r", "verdict": "fail", "bundle_name": "b"}, records)
    q = qualification_report(run)
    assert any(n.startswith("outlier unit R5CW2 of SM8650: -") for n in q.unit_notes), q.unit_notes
    assert any("unit R5CW2 of SM8650: failed on test_updaters_agree" in n for n in q.unit_notes)
    md, page = render_markdown(q), render_html(q)
    assert "## Units of a SoC" in md and "| R5CW2 |" in md
    assert "R5CW2: " in page and "OUTLIER" in page


def test_two_groups_of_units_are_a_spread_not_outliers():
    records = [record(s, noisy(47.0 * (0.8 if s in ("R5CW1", "R5CW2") else 1.0), i)) for i, s in enumerate(SERIALS)]
    [point] = unit_spreads(records)
    assert point.outliers == [] and point.spread > 0.2
