"""The simulated phone's timing model (farm/runner/timing.py): its figures follow the data file's
published anchors, its noise has the tail it claims, heat throttles, knobs slow what they name, and a
device's Nth run reports the same figures every time (its serial, seed and run index fix the draws;
the host's clock and speed change nothing)."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import replace
from types import SimpleNamespace

import pytest

from farm.errors import UsageError
from farm.runner.timing import (
    DATA_FILE,
    HeatFile,
    Noise,
    PhoneTiming,
    TIMING_ENV,
    SimClock,
    Slowdown,
    default_seed,
    load_profiles,
    phone_timing,
    run_random,
    simulate_tok_s,
    simulated_phone,
    unit_factor,
)

QUIET = Noise(sigma=0.0, tail_p=0.0, tail_mean=0.1, unit_sigma=0.0, day_sigma=0.0)
HEAT = load_profiles()[2]


def _quiet(soc: str = "SM8650", **heat) -> PhoneTiming:
    t = phone_timing(soc, "serial")
    return PhoneTiming(soc=t.soc, noise=QUIET, heat=replace(t.heat, **heat))


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


@pytest.mark.statistical
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


@pytest.mark.statistical
def test_units_of_one_soc_differ_and_each_keeps_its_own_speed():
    factors = [unit_factor(f"V8650{i:04d}", 0.025) for i in range(200)]
    assert unit_factor("V86500001", 0.025) == factors[1]
    assert 0.015 < statistics.pstdev(factors) < 0.035


def test_heat_builds_with_busy_time_throttles_and_cools_at_idle():
    heat = replace(HEAT, idle_c=35.0, rise_c=30.0, heat_tau_s=10.0, cool_tau_s=5.0, throttle_c=50.0,
                   throttle_factor=2.0)
    cold = SimClock(_quiet(**vars(heat)), updater="SmartMask", context=128, start_c=35.0,
                    rng=random.Random(0), start_ms=0)
    cold.decode(100)
    assert not cold.throttled and cold.temp_c > 35.0
    hot = SimClock(_quiet(**vars(heat)), updater="SmartMask", context=128, start_c=51.0,
                   rng=random.Random(0), start_ms=0)
    hot.decode(100)
    assert hot.throttled and hot.now_ms() == pytest.approx(2 * cold.now_ms(), rel=0.01)
    assert heat.cooled(51.0, 5.0) == pytest.approx(35 + 16 / 2.718281828, rel=1e-6)


def test_the_heat_file_keeps_heat_and_counts_runs_on_the_phone_s_own_time(tmp_path):
    heat = replace(HEAT, idle_c=35.0, cool_tau_s=10.0, idle_gap_s=10.0)
    f = HeatFile(tmp_path / "system" / "heat.json", heat)
    assert f.read() == 35.0  # a phone that never ran is at idle
    assert f.begin() == (35.0, 0)  # run 0 starts at idle
    f.add_busy(35.0, 45.0)
    assert f.read() == pytest.approx(45.0)  # between runs the phone's time stands: no wall clock
    start_c, index = f.begin()  # the next run starts after the modelled idle gap (one time constant)
    assert index == 1 and start_c == pytest.approx(35.0 + 10.0 / 2.718281828)
    assert f.begin()[1] == 2  # a run that overlapped takes its own index...
    f.add_busy(start_c, start_c + 5.0)
    f.add_busy(start_c, start_c + 5.0)  # ...and adds its own rise
    assert f.read() == pytest.approx(f.heat.cooled(start_c, 10.0) + 10.0)
    assert json.loads(f.path.read_text())["runs"] == 3


def test_a_heat_file_of_an_older_farm_keeps_its_heat_and_starts_counting(tmp_path):
    path = tmp_path / "heat.json"
    path.write_text(json.dumps({"temp_c": 64.0, "wall": 1e12}))  # its wall time is never read
    f = HeatFile(path, HEAT)
    assert f.read() == 64.0 and f.begin() == (pytest.approx(HEAT.cooled(64.0, HEAT.idle_gap_s)), 0)


def test_each_run_s_draws_follow_the_device_s_seed_and_the_run_s_index():
    draws = [run_random(7, i).random() for i in range(3)]
    assert draws == [run_random(7, i).random() for i in range(3)] and len(set(draws)) == 3
    assert run_random(8, 0).random() != draws[0]
    assert phone_timing("SM8650", "V8650SEED").seed == default_seed("V8650SEED") != default_seed("V8650SEEE")
    assert phone_timing("SM8650", "V8650SEED", seed=5).seed == 5


def _runs(tmp_path, monkeypatch, timing: PhoneTiming, n: int, wall: float) -> list[tuple[int, bool]]:
    """``n`` runs of 256 decode steps through ``simulated_phone`` on a fresh device, with the host's
    clock at ``wall`` (advancing 1000 s a run): each run's (duration in ms, throttled)."""
    spec, heat_path = tmp_path / "spec.json", tmp_path / "heat.json"
    heat_path.unlink(missing_ok=True)
    spec.write_text(json.dumps({**timing.to_json(), "heat_path": str(heat_path)}))
    monkeypatch.setenv(TIMING_ENV, str(spec))
    clock = iter(wall + 1000.0 * i for i in range(10 * n))
    monkeypatch.setattr("farm.runner.timing.time.time", lambda: next(clock))
    runner = SimpleNamespace(context_len=4096, clock=None)
    args = SimpleNamespace(kv_updater="ShiftPointer", model_path="none.pte")
    out = []
    for _ in range(n):
        with simulated_phone(runner, args):
            start = runner.clock.now_ms()
            runner.clock.prefill(16)
            runner.clock.decode(256)
            out.append((runner.clock.now_ms() - start, runner.clock.throttled))
    return out


@pytest.mark.statistical
def test_a_device_s_runs_report_the_same_figures_whatever_the_host_s_clock(tmp_path, monkeypatch):
    """The runs of a fresh device with a given serial repeat to the millisecond, with the host's clock
    anywhere (and hours between runs, which would have cooled a wall-clock model): its draws and its
    heat are its own. Long runs at kv 4096 heat it into throttling by its own time alone."""
    timing = replace(phone_timing("SM8650", "V8650REPRO"), heat=replace(HEAT, throttle_c=44.0))
    first = _runs(tmp_path, monkeypatch, timing, 40, wall=1.7e9)
    assert _runs(tmp_path, monkeypatch, timing, 40, wall=2.2e9) == first
    assert len({ms for ms, _ in first}) > 10  # noise: not one figure repeated
    assert not first[0][1] and first[-1][1]  # it heats up run by run, then throttles
    other = _runs(tmp_path, monkeypatch, replace(timing, seed=timing.seed + 1), 40, wall=1.7e9)
    assert other != first  # another seed, other draws


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
    no_seed = {k: v for k, v in timing.to_json().items() if k != "seed"}
    with pytest.raises(UsageError, match="spec.json: not a phone timing spec: KeyError: 'seed'"):
        PhoneTiming.from_json(no_seed, "spec.json")
    no_gap = {**timing.to_json(), "heat": {k: v for k, v in vars(timing.heat).items() if k != "idle_gap_s"}}
    with pytest.raises(UsageError, match="spec.json: not a phone timing spec: TypeError: .*idle_gap_s"):
        PhoneTiming.from_json(no_gap, "spec.json")
    with pytest.raises(UsageError, match="no simulated phone timing for SM6115"):
        phone_timing("SM6115", "u1")
