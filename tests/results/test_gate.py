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
    figure_timings,
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
    if name == "all samples equal":
        assert p == 1.0  # no difference at all: the largest p-value, not an out-of-range one


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


def test_the_smallest_p_value_of_the_exact_test():
    assert min_p_value(3, 3) == pytest.approx(0.1)
    assert min_p_value(4, 4) < 0.05
    assert min_p_value(1, 1) == 1.0
    assert min_p_value(0, 3) == 1.0  # a p-value is never above 1, even with no samples on one side


# (now, base, alpha, the reason): the runs needed are the fewest n with 2 / C(2n, n) < alpha. 3 vs 3 at
# alpha 0.1 can give p = 0.1 at best, which is not below 0.1: too few, however far apart the samples.
TOO_FEW = [
    ([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], 0.05,
     "3 vs 3 samples can never reach p < 0.05 (best 0.1): run at least 4 measured runs on each side"),
    ([50.0, 51.0, 52.0], [100.0, 101.0, 102.0], 0.1,
     "3 vs 3 samples can never reach p < 0.1 (best 0.1): run at least 4 measured runs on each side"),
    ([50.0, 51.0], [100.0, 101.0], 0.2,
     "2 vs 2 samples can never reach p < 0.2 (best 0.333): run at least 3 measured runs on each side"),
    ([50.0], [100.0], 0.5,
     "1 vs 1 samples can never reach p < 0.5 (best 1): run at least 2 measured runs on each side"),
]


@pytest.mark.parametrize("now, base, alpha, reason", TOO_FEW, ids=["3v3", "3v3-at-best-p", "2v2", "1v1"])
def test_too_few_samples_says_how_many_are_needed(now, base, alpha, reason):
    assert compare_samples(now, base, GateConfig(alpha=alpha)) == (PointVerdict.INCONCLUSIVE, None, reason)


def test_no_baseline_samples_is_new():
    assert compare_samples([1.0, 2.0], []) == (PointVerdict.NEW, None, "no baseline samples at this point")


def test_no_samples_of_the_run_is_a_programming_error():
    with pytest.raises(ValueError, match=r"^compare_samples: no samples of this run$"):
        compare_samples([], [1.0, 2.0])


@pytest.mark.parametrize("kwargs, message", [
    ({"alpha": 0}, "gate alpha must be in (0, 1), got 0"),
    ({"alpha": 1}, "gate alpha must be in (0, 1), got 1"),
    ({"alpha": 1.5}, "gate alpha must be in (0, 1), got 1.5"),
    ({"min_effect": 1.5}, "gate minimum effect must be in [0, 100) %, got 150%"),
    ({"min_effect": 1}, "gate minimum effect must be in [0, 100) %, got 100%"),
    ({"min_effect": -0.01}, "gate minimum effect must be in [0, 100) %, got -1%"),
    ({"min_effect": float("nan")}, "gate minimum effect must be in [0, 100) %, got nan%"),
])
def test_bad_config_is_refused_naming_the_setting_and_value(kwargs, message):
    with pytest.raises(UsageError) as caught:
        GateConfig(**kwargs)
    assert str(caught.value) == message


def test_the_edges_of_a_good_config_are_accepted():
    GateConfig(alpha=0.999, min_effect=0.0)
    GateConfig(alpha=1e-9, min_effect=0.999)


# -- the edges of the verdict rules -------------------------------------------------------------------

def test_a_p_value_equal_to_alpha_is_not_significant():
    now, base = [1.0, 2.0, 3.0, 4.0, 6.0], [5.0, 7.0, 8.0, 9.0, 10.0]  # one inversion: p = 4/252
    verdict, p, _ = compare_samples(now, base)
    assert verdict == PointVerdict.REGRESSED
    verdict, p_again, reason = compare_samples(now, base, GateConfig(alpha=p))
    assert (verdict, p_again) == (PointVerdict.INCONCLUSIVE, p), reason
    assert reason == f"median -62.5% but p = {p:.3g} >= {p:g}: too noisy to tell, run more"


def test_a_constant_run_against_another_constant_baseline_is_a_change():
    """Every sample of one side equal, the other side's too, but the two differ: a clear difference,
    judged by the rank test (p is 1 only when every sample of both sides is equal)."""
    verdict, p, reason = compare_samples([10.0] * 8, [12.0] * 8)
    assert verdict == PointVerdict.REGRESSED, reason
    assert p is not None and p < 0.001
    assert reason == f"median -16.7%, p = {p:.3g} < 0.05"


@pytest.mark.parametrize("unit, now, want", [
    ("ms", 40.0, PointVerdict.REGRESSED),  # a latency that was 0 ms and is 40 ms now has grown
    ("tok/s", 40.0, PointVerdict.IMPROVED),
    ("ms", 0.0, PointVerdict.UNCHANGED),
])
def test_from_a_baseline_median_of_zero_any_change_is_beyond_the_effect_size(unit, now, want):
    base = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    samples = [now] * 7 + [now + 1.0]
    verdict, p, reason = compare_samples(samples, base, unit=unit)
    assert verdict == want, reason


@pytest.mark.parametrize("unit", ["ms", "tok/s"])
def test_equal_medians_are_unchanged_even_with_no_minimum_effect(unit):
    """With a minimum effect of 0 any significant change counts, but the direction comes from the
    medians: equal medians (here with clearly different samples either side of them) are no change."""
    now = [10.0] * 5 + [20.0] * 4
    base = [0.0] * 4 + [10.0] * 5
    verdict, p, reason = compare_samples(now, base, GateConfig(min_effect=0.0), unit=unit)
    assert verdict == PointVerdict.UNCHANGED, reason
    assert reason == "median +0.0%, within the 0% effect size"


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
    assert (m.metric, m.unit) == ("tok_s", "tok/s")


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


@pytest.mark.parametrize("now_median, want", [(90.5, PointVerdict.UNCHANGED), (90.0, PointVerdict.REGRESSED),
                                              (89.0, PointVerdict.REGRESSED)])
def test_the_effect_size_is_relative_to_the_baselines_median(now_median, want):
    """A 9.5% drop from a baseline of 100 is within a 10% minimum effect; 10% (the minimum itself) and
    11% are not. Relative to the new median instead, 100 -> 90.5 would read as 10.5% and fail a merge
    that moved less than allowed."""
    base = [99.0, 99.5, 100.0, 100.5, 101.0, 100.0, 100.0, 100.0]
    now = [now_median + d for d in (-1.0, -0.5, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0)]
    verdict, p, reason = compare_samples(now, base, GateConfig(min_effect=0.10))
    assert verdict == want, reason
    size = f"median {(now_median - 100.0):+.1f}%"  # baseline 100: percent = difference
    assert p is not None and p < 0.05
    if want == PointVerdict.UNCHANGED:
        assert reason == f"{size}, within the 10% effect size"
    else:
        assert reason == f"{size}, p = {p:.3g} < 0.05"


def test_a_points_delta_is_relative_to_the_baseline():
    now = _run("now", [_tput("SM8650", "a", "SmartMask", [80.0, 80.0, 80.0])])
    base = _run("base", [_tput("SM8650", "a", "SmartMask", [100.0, 100.0, 100.0])])
    assert evaluate(now, base).points[0].delta == pytest.approx(-0.20)


# -- what a run's records give the gate ---------------------------------------------------------------

def _latency(soc: str, values: list[float], unit: str = "ms") -> TestRecord:
    return TestRecord(f"tests/test_latency.py::test_first_token[{soc}]", Outcome.PASSED, soc, "a",
                      measurements=[Measurement("first_token", unit, values, "SmartMask", "kv", 64)])


def test_a_gate_point_carries_the_comparisons_verdict_reason_and_p_value():
    base = _run("base", [_tput("SM8650", "a", "SmartMask", _normal(100, 1, 8, 41))])
    now = _run("now", [_tput("SM8650", "a", "SmartMask", _normal(70, 1, 8, 42))])
    gate = evaluate(now, base)
    [point] = gate.points
    assert (point.verdict, point.p_value, point.reason) == compare_samples(point.now, point.base)
    assert point.unit == "tok/s" and point.reason.startswith("median -")
    assert gate.baseline_id == "base"
    assert (gate.count(PointVerdict.REGRESSED), gate.count(PointVerdict.UNCHANGED)) == (1, 0)


def test_lower_is_better_units_are_judged_as_such_through_a_run():
    """A latency point recorded in ms that grew 30% is a regression of the run, not an improvement."""
    base = _run("base", [_latency("SM8650", _normal(10, 0.1, 8, 43))])
    now = _run("now", [_latency("SM8650", _normal(13, 0.1, 8, 44))])
    gate = evaluate(now, base)
    assert [(p.unit, p.verdict) for p in gate.points] == [("ms", PointVerdict.REGRESSED)]
    assert gate.verdict == GateVerdict.REGRESSED


def test_the_runs_gate_uses_its_configuration():
    base = _run("base", [_tput("SM8650", "a", "SmartMask", _normal(100, 1, 8, 45))])
    now = _run("now", [_tput("SM8650", "a", "SmartMask", _normal(80, 1, 8, 46))])
    assert evaluate(now, base).verdict == GateVerdict.REGRESSED
    lenient = evaluate(now, base, GateConfig(min_effect=0.5))
    assert [p.verdict for p in lenient.points] == [PointVerdict.UNCHANGED]
    assert lenient.verdict == GateVerdict.PASS and "within the 50% effect size" in lenient.points[0].reason


def test_a_baseline_without_a_run_id_is_named_baseline():
    base = QualificationResults({}, [_tput("SM8650", "a", "SmartMask", [100.0] * 4)])
    assert evaluate(_run("now", [_tput("SM8650", "a", "SmartMask", [100.0] * 4)]), base).baseline_id == "baseline"


@pytest.mark.parametrize("key, what", [("bundle_name", "bundle"), ("runner_dialect", "runner dialect"),
                                       ("virtual", "virtual flag")])
def test_a_baseline_of_another_kind_of_run_is_noted(key, what):
    now = _run("now", [_tput("SM8650", "a", "SmartMask", [1.0, 2.0])], **{key: "this"})
    gate = evaluate(now, _run("base", [], **{key: "that"}))
    assert f"the baseline's {what} is 'that', this run's 'this'" in gate.notes
    assert evaluate(now, _run("base", [], **{key: "this"})).notes == []


def test_a_note_needs_both_sides_to_say():
    """A run or baseline that did not record a field (older results) is not noted as different."""
    now = QualificationResults({"run_id": "now"}, [_tput("SM8650", "a", "SmartMask", [1.0, 2.0])])
    assert evaluate(now, _run("base", [])).notes == []
    assert evaluate(_run("now", []), QualificationResults({"run_id": "base"}, [])).notes == []


@pytest.mark.parametrize("meta, named", [({"run_id": "base-7"}, "run base-7"), ({}, "run ?")])
def test_a_baseline_point_in_another_unit_is_refused_naming_the_run_and_point(meta, named):
    base = QualificationResults(meta, [_latency("SM8650", [10.0] * 4, unit="s")])
    now = _run("now", [_latency("SM8650", [10.0] * 4, unit="ms")])
    with pytest.raises(UsageError) as caught:
        evaluate(now, base)
    assert str(caught.value) == f"{named}: SM8650 kv/64/SmartMask first_token is in 's', this run's in 'ms'"


@pytest.mark.parametrize("meta, named", [({"run_id": "r5"}, "run r5"), ({}, "run ?")])
def test_a_point_measured_in_two_units_in_one_run_is_refused(meta, named):
    run = QualificationResults(meta, [_latency("SM8650", [10.0]), _latency("SM8650", [0.01], unit="s")])
    with pytest.raises(UsageError) as caught:
        evaluate(run, None)
    assert str(caught.value) == f"{named}: SM8650 kv/64/SmartMask first_token measured in 'ms' and 's'"


def test_every_passed_or_failed_record_counts_whatever_comes_before_it():
    """Erred and skipped records, and measurements with no samples, are left out; the records and
    measurements after them still count. A record without a SoC is pooled under '?'."""
    spoiled = _tput("SM8650", "a", "SmartMask", [1.0], outcome=Outcome.ERROR)
    skipped = _tput("SM8650", "a", "SmartMask", [], outcome=Outcome.SKIPPED)
    failed = _tput("SM8650", "b", "SmartMask", [5.0], outcome=Outcome.FAILED)
    empty_first = TestRecord("t::x", Outcome.PASSED, None, None, measurements=[
        Measurement("tok_s", "tok/s", [], "ShiftPointer", "kv", 64),
        Measurement("tok_s", "tok/s", [7.0, 8.0], "ShiftPointer", "kv", 64, 5.0)])
    gate = evaluate(_run("now", [spoiled, skipped, failed, empty_first]), None)
    assert [(str(p.key), p.now, p.serials, p.threshold) for p in gate.points] == [
        ("? kv/64/ShiftPointer tok_s", [7.0, 8.0], [], 5.0),
        ("SM8650 kv/64/SmartMask tok_s", [5.0], ["b"], 20.0)]
    assert all(p.verdict == PointVerdict.NEW for p in gate.points)


# -- records written before the suites recorded measurements ------------------------------------------

def _old_record(**properties: str) -> TestRecord:
    return TestRecord("suites/test_throughput.py::test_min_throughput[SM8650-kv-64-SmartMask]",
                      Outcome.PASSED, "SM8650", "a", properties=properties)


def test_old_throughput_properties_without_mode_or_seq_len():
    [m] = measurements_of(_old_record(**{"tok_s_runs.SmartMask": "10 11"}))
    assert m == Measurement("tok_s", "tok/s", [10.0, 11.0], "SmartMask", "", 0, None)


def test_a_threshold_is_only_for_a_record_of_one_updater():
    record = _old_record(**{"tok_s_runs.SmartMask": "10", "tok_s_runs.ShiftPointer": "12",
                            "threshold_tok_s": "20"})
    assert [(m.updater, m.threshold) for m in measurements_of(record)] == [("ShiftPointer", None),
                                                                           ("SmartMask", None)]


def test_old_records_feed_the_gate_like_new_ones():
    base = _run("base", [_old_record(**{"tok_s_runs.SmartMask": "100 101 99 100 100", "mode": "kv",
                                        "seq_len": "64"})])
    now = _run("now", [_tput("SM8650", "a", "SmartMask", [80.0, 81.0, 79.0, 80.0, 80.0])])
    [point] = evaluate(now, base).points
    assert point.verdict == PointVerdict.REGRESSED and point.base == [100.0, 101.0, 99.0, 100.0, 100.0]


@pytest.mark.parametrize("properties, run_id, message", [
    ({"tok_s_runs.SmartMask": "10 nan"}, "r1",
     "property tok_s_runs.SmartMask: '10 nan' holds a value that is not finite"),
    ({"tok_s_runs.SmartMask": "10 inf"}, None,
     "property tok_s_runs.SmartMask: '10 inf' holds a value that is not finite"),
    ({"tok_s_runs.SmartMask": "10.5 fast"}, "r9",
     "property tok_s_runs.SmartMask: '10.5 fast' is not a list of numbers"),
    ({"tok_s_runs.SmartMask": "10", "seq_len": "64k"}, "r2", "property seq_len '64k' is not an integer"),
    ({"tok_s_runs.SmartMask": "10", "threshold_tok_s": "twenty"}, "r3",
     "property threshold_tok_s: 'twenty' is not a list of numbers"),
])
def test_bad_throughput_properties_are_refused_naming_the_run_record_and_property(properties, run_id,
                                                                                  message):
    record = _old_record(**properties)
    where = f"run {run_id or '?'}: record {record.nodeid}"
    with pytest.raises(UsageError) as caught:
        measurements_of(record) if run_id is None else measurements_of(record, run_id)
    assert str(caught.value) == f"{where}: {message}"
    # Through the gate, the run's own id names it.
    with pytest.raises(UsageError) as caught:
        evaluate(QualificationResults({"run_id": run_id} if run_id else {}, [record]), None)
    assert str(caught.value) == f"{where}: {message}"


def _timed(record: TestRecord, timing: str) -> TestRecord:
    for m in record.measurements:
        m.timing = timing
    return record


def test_figures_of_another_timing_are_another_point_never_pooled_nor_compared():
    """A simulated phone, a virtual device's host CPU and a phone of one SoC are three points: a
    measured run against a simulated baseline compares nothing (every point new, a note says why),
    and devices of two timings in one run are never pooled."""
    base = _run("base", [_timed(_tput("SM8650", "sim", "SmartMask", _normal(100, 1, 8, 21)), "simulated")])
    now = _run("now", [_timed(_tput("SM8650", "phone", "SmartMask", _normal(50, 1, 8, 22)), "measured"),
                       _timed(_tput("SM8650", "vdev", "SmartMask", _normal(900, 1, 8, 23)), "host-cpu")])
    gate = evaluate(now, base)
    by_timing = {p.key.timing: p for p in gate.points}
    assert set(by_timing) == {"measured", "host-cpu"}
    assert by_timing["measured"].serials == ["phone"] and by_timing["host-cpu"].serials == ["vdev"]
    assert {p.verdict for p in gate.points} == {PointVerdict.NEW}  # not "regressed by 50 %"
    assert any("never compared" in n and "simulated" in n for n in gate.notes), gate.notes
    assert str(by_timing["host-cpu"].key) == "SM8650 kv/64/SmartMask tok_s (host-cpu)"
    assert str(by_timing["measured"].key) == "SM8650 kv/64/SmartMask tok_s"
    assert figure_timings(now) == frozenset({"measured", "host-cpu"})
    # The same timing on both sides is compared as before.
    again = evaluate(_run("again", [_timed(_tput("SM8650", "sim", "SmartMask", _normal(80, 1, 8, 24)),
                                           "simulated")]), base)
    assert [p.verdict for p in again.points] == [PointVerdict.REGRESSED] and not again.notes
