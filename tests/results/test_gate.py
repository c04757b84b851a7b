"""The regression gate on synthetic samples: verdicts per point, the run's gate, exit codes, and proof
that these tests catch a broken comparison."""

from __future__ import annotations

import random

import pytest

from farm.errors import UsageError
from farm.exitcodes import ExitCode
from farm.results.gate import (
    GateConfig,
    GateVerdict,
    PointKey,
    PointVerdict,
    compare_samples,
    evaluate,
    exit_code,
    measurements_of,
    min_p_value,
)
from farm.results.records import Measurement, QualificationResults, TestRecord
from farm.vocab import ErrorKind, Outcome, Verdict


def _normal(mean: float, sd: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)  # fixed seeds: the same samples every run
    return [rng.gauss(mean, sd) for _ in range(n)]


# (name, now, baseline, unit, expected verdict)
SCENARIOS = [
    ("clearly slower", _normal(85, 2, 10, 1), _normal(100, 2, 10, 2), "tok/s", PointVerdict.REGRESSED),
    ("clearly faster", _normal(115, 2, 10, 3), _normal(100, 2, 10, 4), "tok/s", PointVerdict.IMPROVED),
    ("same distribution", _normal(100, 2, 10, 5), _normal(100, 2, 10, 6), "tok/s", PointVerdict.UNCHANGED),
    ("3 vs 3 overlapping", [99.0, 101.0, 103.0], [100.0, 102.0, 98.0], "tok/s", PointVerdict.INCONCLUSIVE),
    ("3 vs 3 far apart", [50.0, 51.0, 52.0], [100.0, 101.0, 102.0], "tok/s", PointVerdict.INCONCLUSIVE),
    ("noisy, medians 15% apart", [85.0, 130.0, 50.0, 95.0, 70.0, 120.0],
     [100.0, 60.0, 140.0, 90.0, 110.0, 75.0], "tok/s", PointVerdict.INCONCLUSIVE),
    ("significant but 2% only", _normal(98, 0.1, 20, 7), _normal(100, 0.1, 20, 8), "tok/s",
     PointVerdict.UNCHANGED),
    ("latency grew (lower is better)", _normal(12, 0.2, 8, 9), _normal(10, 0.2, 8, 10), "ms",
     PointVerdict.REGRESSED),
    ("all samples equal", [10.0] * 6, [10.0] * 6, "tok/s", PointVerdict.UNCHANGED),
]


def _mismatches(compare) -> list[str]:
    """The scenarios a comparison function gets wrong."""
    return [name for name, now, base, unit, want in SCENARIOS
            if compare(now, base, GateConfig(), unit=unit)[0] != want]


@pytest.mark.parametrize("name,now,base,unit,want", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_point_verdicts(name, now, base, unit, want):
    verdict, p, reason = compare_samples(now, base, GateConfig(), unit=unit)
    assert verdict == want, reason
    if want in (PointVerdict.REGRESSED, PointVerdict.IMPROVED):
        assert p is not None and p < 0.05


def test_a_broken_comparison_is_caught():
    """The scenarios above must be able to fail: a gate that swaps now and baseline, ignores the
    effect size, or ignores the p-value gets some of them wrong."""
    assert _mismatches(compare_samples) == []

    def swapped(now, base, config, *, unit):
        return compare_samples(base, now, config, unit=unit)

    def no_effect_size(now, base, config, *, unit):
        return compare_samples(now, base, GateConfig(min_effect=0.0), unit=unit)

    def no_p_value(now, base, config, *, unit):
        return compare_samples(now, base, GateConfig(alpha=0.999999), unit=unit)

    assert {"clearly slower", "clearly faster"} <= set(_mismatches(swapped))
    assert "significant but 2% only" in _mismatches(no_effect_size)
    assert "noisy, medians 15% apart" in _mismatches(no_p_value)


def test_too_few_samples_says_how_many_are_needed():
    assert min_p_value(3, 3) == pytest.approx(0.1)
    assert min_p_value(4, 4) < 0.05
    verdict, p, reason = compare_samples([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    assert (verdict, p) == (PointVerdict.INCONCLUSIVE, None)
    assert "at least 4 measured runs" in reason


def test_no_baseline_samples_is_new():
    assert compare_samples([1.0, 2.0], [])[0] == PointVerdict.NEW


def test_bad_config_is_refused():
    with pytest.raises(UsageError, match="effect"):
        GateConfig(min_effect=1.5)
    with pytest.raises(UsageError, match="alpha"):
        GateConfig(alpha=0)


# -- a run against a baseline -------------------------------------------------------------------------

def _tput(soc: str, serial: str, updater: str, values: list[float], *, outcome=Outcome.PASSED,
          threshold: float | None = 20.0) -> TestRecord:
    return TestRecord(f"suites/test_throughput.py::test_min_throughput[{soc}-kv-64-{updater}]", outcome,
                      soc, serial, measurements=[Measurement("tok_s", "tok/s", values, updater, "kv", 64,
                                                             threshold)])


def _run(run_id: str, records: list[TestRecord], **meta) -> QualificationResults:
    return QualificationResults({"run_id": run_id, "bundle_name": "reference-tiny", **meta}, records)


def test_run_against_baseline_pools_devices_of_a_soc():
    base = _run("base", [_tput("SM8650", "a", "SmartMask", _normal(100, 1, 5, 11)),
                         _tput("SM8650", "b", "SmartMask", _normal(100, 1, 5, 12)),
                         _tput("SM8650", "a", "ShiftPointer", _normal(100, 1, 8, 13))])
    now = _run("now", [_tput("SM8650", "a", "SmartMask", _normal(80, 1, 4, 14)),
                       _tput("SM8650", "b", "SmartMask", _normal(80, 1, 4, 15)),
                       _tput("SM8650", "a", "ShiftPointer", _normal(100, 1, 8, 16)),
                       _tput("SM8550", "c", "SmartMask", _normal(50, 1, 8, 17))])
    gate = evaluate(now, base)
    by_key = {(p.key.soc, p.key.updater): p for p in gate.points}
    smart = by_key[("SM8650", "SmartMask")]
    assert (len(smart.now), len(smart.base), smart.serials) == (8, 10, ["a", "b"])
    assert smart.verdict == PointVerdict.REGRESSED and smart.delta == pytest.approx(-0.2, abs=0.03)
    assert by_key[("SM8650", "ShiftPointer")].verdict == PointVerdict.UNCHANGED
    assert by_key[("SM8550", "SmartMask")].verdict == PointVerdict.NEW
    assert gate.verdict == GateVerdict.REGRESSED and gate.failed
    assert smart.key == PointKey("SM8650", "tok_s", "kv", 64, "SmartMask")
    assert smart.threshold_ok is True and smart.prob_greater == 0.0


def test_erred_records_are_no_evidence():
    base = _run("base", [_tput("SM8650", "a", "SmartMask", _normal(100, 1, 8, 21))])
    spoiled = _tput("SM8650", "a", "SmartMask", _normal(10, 1, 8, 22), outcome=Outcome.ERROR)
    spoiled.error_kind = ErrorKind.INFRA
    gate = evaluate(_run("now", [spoiled]), base)
    assert gate.points == [] and gate.verdict == GateVerdict.PASS


def test_inconclusive_fails_only_when_asked():
    base = _run("base", [_tput("SM8650", "a", "SmartMask", [100.0, 101.0, 99.0])])
    now = _run("now", [_tput("SM8650", "a", "SmartMask", [98.0, 100.5, 102.0])])
    assert evaluate(now, base).verdict == GateVerdict.INCONCLUSIVE
    assert not evaluate(now, base).failed
    assert evaluate(now, base, GateConfig(inconclusive_fails=True)).failed


def test_no_baseline_never_fails_and_notes_a_different_bundle():
    now = _run("now", [_tput("SM8650", "a", "SmartMask", [1.0, 2.0])])
    assert evaluate(now, None).verdict == GateVerdict.NO_BASELINE
    gate = evaluate(now, _run("base", [], bundle_name="other"))
    assert any("bundle is 'other'" in n for n in gate.notes)


def test_measurements_from_the_throughput_suites_properties():
    record = TestRecord("suites/test_throughput.py::test_min_throughput[SM8650-kv-64-SmartMask]",
                        Outcome.PASSED, "SM8650", "a",
                        properties={"mode": "kv", "seq_len": "64", "tok_s_runs.SmartMask": "10.5 11.0 9.5",
                                    "threshold_tok_s": "20.0"})
    [m] = measurements_of(record)
    assert (m.values, m.updater, m.mode, m.seq_len, m.threshold) == ([10.5, 11.0, 9.5], "SmartMask",
                                                                     "kv", 64, 20.0)
    record.properties["tok_s_runs.SmartMask"] = "10.5 fast"
    with pytest.raises(UsageError, match=r"run r9: record .*SM8650-kv-64-SmartMask.*tok_s_runs"):
        measurements_of(record, "r9")


def test_exit_codes_combine_tests_and_gate():
    base = _run("base", [_tput("SM8650", "a", "SmartMask", _normal(100, 1, 8, 31))])
    regressed = evaluate(_run("now", [_tput("SM8650", "a", "SmartMask", _normal(70, 1, 8, 32))]), base)
    clean = evaluate(_run("now", [_tput("SM8650", "a", "SmartMask", _normal(100, 1, 8, 33))]), base)
    assert exit_code(Verdict.FAIL, regressed) == ExitCode.TEST_FAILURE  # a failure wins
    assert exit_code(Verdict.PASS, regressed) == ExitCode.REGRESSION
    assert exit_code(Verdict.INFRA_ERROR, regressed) == ExitCode.REGRESSION
    assert exit_code(Verdict.INFRA_ERROR, clean) == ExitCode.INFRA
    assert exit_code(Verdict.PASS, clean) == ExitCode.OK
    assert exit_code("pass", None) == ExitCode.OK
    assert exit_code(Verdict.PASS, regressed, interrupted=True) == ExitCode.INTERRUPTED


@pytest.mark.parametrize("now_median, want", [(90.5, PointVerdict.UNCHANGED), (89.0, PointVerdict.REGRESSED)])
def test_the_effect_size_is_relative_to_the_baselines_median(now_median, want):
    """A 9.5% drop from a baseline of 100 is within a 10% minimum effect; 11% is not. Relative to the
    new median instead, 100 -> 90.5 would read as 10.5% and fail a merge that moved less than allowed."""
    base = [99.0, 99.5, 100.0, 100.5, 101.0, 100.0, 100.0, 100.0]
    now = [now_median + d for d in (-1.0, -0.5, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0)]
    verdict, p, reason = compare_samples(now, base, GateConfig(min_effect=0.10))
    assert verdict == want, reason
    assert f"median {(now_median - 100.0):+.1f}%" in reason  # baseline 100: percent = difference
    assert p is not None and p < 0.05


def test_a_points_delta_is_relative_to_the_baseline():
    now = _run("now", [_tput("SM8650", "a", "SmartMask", [80.0, 80.0, 80.0])])
    base = _run("base", [_tput("SM8650", "a", "SmartMask", [100.0, 100.0, 100.0])])
    assert evaluate(now, base).points[0].delta == pytest.approx(-0.20)
