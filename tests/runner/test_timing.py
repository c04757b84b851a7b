"""The simulated phone's timing model (farm/runner/timing.py): its figures follow the data file's
published anchors, its noise has the tail it claims, heat throttles, and knobs slow what they name."""

from __future__ import annotations

import random
import statistics

import pytest

from farm.errors import UsageError
from farm.runner.timing import (
    DATA_FILE,
    Heat,
    HeatFile,
    Noise,
    PhoneTiming,
    SimClock,
    Slowdown,
    load_profiles,
    phone_timing,
    simulate_tok_s,
    unit_factor,
)

QUIET = Noise(sigma=0.0, tail_p=0.0, tail_mean=0.1, unit_sigma=0.0, day_sigma=0.0)


def _quiet(soc: str = "SM8650", **heat) -> PhoneTiming:
    t = phone_timing(soc, "serial")
    return PhoneTiming(soc=t.soc, noise=QUIET, heat=Heat(**heat) if heat else t.heat)


def test_the_data_file_has_every_figure_with_its_source():
    socs, _, _ = load_profiles()
    assert {"SM8650", "SM8750"} <= set(socs)
    for soc in socs.values():
        assert soc.source and set(soc.decode) == {"SmartMask", "ShiftPointer"}
    # upstream's published SM8650 figure at kv 4096 (pytorch/executorch #7694)
    assert 1000 / socs["SM8650"].decode_ms("SmartMask", 4096) == pytest.approx(47.0)
    assert 1000 / socs["SM8650"].decode_ms("ShiftPointer", 4096) == pytest.approx(40.0)
    assert "7694" in DATA_FILE.read_text()


def test_decode_cost_is_interpolated_in_milliseconds_and_flat_outside_the_anchors():
    soc = load_profiles()[0]["SM8650"]
    lo, hi = soc.decode_ms("SmartMask", 128), soc.decode_ms("SmartMask", 4096)
    assert soc.decode_ms("SmartMask", 64) == lo and soc.decode_ms("SmartMask", 8192) == hi
    assert soc.decode_ms("SmartMask", 2112) == pytest.approx((lo + hi) / 2)
    with pytest.raises(UsageError, match="no figures for the 'Fancy' updater"):
        soc.decode_ms("Fancy", 128)


def test_a_quiet_run_reports_the_published_rate_with_prefill_counted_in():
    timing = _quiet()
    rate, clock = simulate_tok_s(timing, updater="SmartMask", context=4096, prompt_tokens=0,
                                 generated=100, rng=random.Random(1))
    assert rate == pytest.approx(47.0, rel=0.01) and not clock.throttled
    with_prefill, _ = simulate_tok_s(timing, updater="SmartMask", context=4096, prompt_tokens=520,
                                     generated=100, rng=random.Random(1))
    # 520 prompt tokens at 520 tok/s add one second to 100 / 47 s
    assert with_prefill == pytest.approx(100 / (100 / 47 + 1), rel=0.01)


def test_run_noise_has_its_spread_and_a_heavy_tail():
    timing = phone_timing("SM8650", "x")
    rng = random.Random(7)
    rates = [simulate_tok_s(timing, updater="SmartMask", context=4096, prompt_tokens=0, generated=64,
                            rng=rng)[0] for _ in range(4000)]
    median = statistics.median(rates)
    slow = sum(r < median * 0.95 for r in rates) / len(rates)
    fast = sum(r > median * 1.05 for r in rates) / len(rates)
    assert 0.02 < slow < 0.06 and fast < 0.002  # the tail is on the slow side only
    core = sorted(rates)[len(rates) // 10 : -len(rates) // 10]
    assert statistics.pstdev(core) / median < timing.noise.sigma


def test_units_of_one_soc_differ_and_each_keeps_its_own_speed():
    factors = [unit_factor(f"V8650{i:04d}", 0.025) for i in range(200)]
    assert unit_factor("V86500001", 0.025) == factors[1]
    assert 0.015 < statistics.pstdev(factors) < 0.035


def test_heat_builds_with_busy_time_throttles_and_cools_at_idle():
    heat = Heat(idle_c=35.0, rise_c=30.0, heat_tau_s=10.0, cool_tau_s=5.0, throttle_c=50.0,
                throttle_factor=2.0)
    cold = SimClock(_quiet(**vars(heat)), updater="SmartMask", context=128, start_c=35.0, start_ms=0)
    cold.decode(100)
    assert not cold.throttled and cold.temp_c > 35.0
    hot = SimClock(_quiet(**vars(heat)), updater="SmartMask", context=128, start_c=51.0, start_ms=0)
    hot.decode(100)
    assert hot.throttled and hot.now_ms() == pytest.approx(2 * cold.now_ms(), rel=0.01)
    assert heat.cooled(51.0, 5.0) == pytest.approx(35 + 16 / 2.718281828, rel=1e-6)


def test_the_heat_file_keeps_heat_between_runs_and_cools_it_by_the_wall_clock(tmp_path):
    heat = Heat(idle_c=35.0, cool_tau_s=10.0)
    f = HeatFile(tmp_path / "system" / "heat.json", heat)
    assert f.read(wall=100.0) == 35.0  # a phone that never ran is at idle
    f.add_busy(35.0, 45.0, wall=100.0)
    assert f.read(wall=100.0) == pytest.approx(45.0)
    assert f.read(wall=110.0) == pytest.approx(35.0 + 10.0 / 2.718281828)
    f.add_busy(35.0, 40.0, wall=100.0)  # a run that overlapped adds its own rise
    assert f.read(wall=100.0) == pytest.approx(50.0)


def test_a_slowdown_knob_slows_only_what_it_names():
    base = phone_timing("SM8650", "s", slowdowns=(Slowdown(1.05, flag="kv_updater", value="SmartMask"),
                                                   Slowdown(1.10, model_sha256="ab" * 32)))
    assert base.slowdown({"kv_updater": "SmartMask"}, None) == pytest.approx(1.05)
    assert base.slowdown({"kv_updater": "ShiftPointer"}, None) == 1.0
    assert base.slowdown({"kv_updater": "SmartMask"}, "ab" * 32) == pytest.approx(1.155)
    quiet = _quiet()
    a, _ = simulate_tok_s(quiet, updater="SmartMask", context=128, prompt_tokens=8, generated=64,
                          rng=random.Random(3))
    b, _ = simulate_tok_s(quiet, updater="SmartMask", context=128, prompt_tokens=8, generated=64,
                          rng=random.Random(3), slowdown=1.05)
    assert a / b == pytest.approx(1.05, rel=1e-3)


@pytest.mark.parametrize("knob, message", [
    (dict(factor=0), "factor must be a number > 0"),
    (dict(factor=1.1), "either flag and value, or model_sha256"),
    (dict(factor=1.1, flag="kv_updater"), "either flag and value, or model_sha256"),
    (dict(factor=1.1, flag="kv_updater", value="SmartMask", model_sha256="ab"), "either"),
])
def test_a_bad_knob_is_refused(knob, message):
    with pytest.raises(UsageError, match=message):
        Slowdown(**knob)


def test_a_spec_round_trips_and_a_bad_one_names_its_file(tmp_path):
    timing = phone_timing("SM8750", "u1", slowdowns=(Slowdown(1.2, flag="eval_mode", value="1"),))
    assert PhoneTiming.from_json(timing.to_json(), "x") == timing
    with pytest.raises(UsageError, match="spec.json: not a phone timing spec"):
        PhoneTiming.from_json({"soc": {"soc": "SM8650"}}, "spec.json")
    with pytest.raises(UsageError, match="no simulated phone timing for SM6115"):
        phone_timing("SM6115", "u1")
