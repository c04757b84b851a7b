"""Throughput: tokens/second against the bundle's thresholds (minimums per SoC, mode, seq_len and
updater; relative rules between updaters). Warm-up runs first, then N measured runs, all kept; the
median is compared. Phones are first left to cool under --farm-max-temp, and so are simulated phones
(virtual devices with a phone's timing model, whose heat builds with their runs); host-timed virtual
devices are not. Each device's figures are marked with where they come from: measured on a phone,
the host CPU of a virtual device, or SIMULATED by a virtual device's phone model. Every measured run of every
point is recorded raw (``record_measurement``) for the results store and the regression gate."""

from __future__ import annotations

import statistics

import pytest

from farm.results.checks import below_minimum, too_slow
from farm.vocab import Timing
from ptefarm_fixtures import DeviceLowBattery
from ptefarm_suites.cases import RelativeRule, Thresholds

from ._data import bundle_thresholds

PHONE_MAX_TEMP_C = 40.0
BATTERY_FLOOR_PCT = 20   # under it a phone may cap its clocks to save power
MAX_RETAKES = 2          # throttled runs re-taken per point, at most
pytestmark = [pytest.mark.throughput, pytest.mark.release]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "point" not in metafunc.fixturenames:
        return
    th = bundle_thresholds(metafunc.config)
    if metafunc.definition.originalname == "test_min_throughput":
        points = sorted({(r.mode, r.seq_len, r.updater) for r in th.minimums}) if th else []
        ids = [f"{m}-{s}-{u}" for m, s, u in points]
        what = "minimum"
    else:
        points = sorted({RelativeRule("*", r.mode, r.seq_len, r.faster, r.slower, 0.0)
                         for r in th.relative}, key=str) if th else []
        ids = [f"{r.mode}-{r.seq_len}-{r.faster}-vs-{r.slower}" for r in points]
        what = "relative"
    if not points:
        where = th.path if th else "no thresholds file for this bundle"
        metafunc.parametrize("point", [pytest.param(None, id=f"no-{what}-rules", marks=pytest.mark.skip(
            reason=f"no {what} throughput rule ({where})"))])
        return
    metafunc.parametrize("point", points, ids=ids)


def measure(llm, farm, thresholds: Thresholds, record_measurement, *, mode: str, seq_len: int,
            updater: str, threshold: float | None = None) -> list[float]:
    """The measured runs (warm-ups dropped), recorded raw with the conditions of each: one runner
    invocation per run, each its own process as upstream's CI runs it. Not --num_iters:
    qnn_llama_runner v1.0.1 keeps its position across iterations, so the second iteration of a run
    that filled its seq_len aborts.

    The device is cooled first (phones and simulated phones), must be above the battery floor, and
    is held in forced deep idle while measuring. A measured run during which the device reported
    throttling (thermal status MODERATE or above, before or after it) is re-taken after a cool-down,
    at most ``MAX_RETAKES`` times per point; a run kept throttled says so in its conditions."""
    device = llm.device
    limit = farm.options.max_temp_c or (None if device.timing == Timing.HOST_CPU else PHONE_MAX_TEMP_C)
    if limit is not None:
        temp = device.wait_cool(limit, farm.options.cool_timeout_s)
        llm.record("battery_temp_c", "unknown" if temp is None else f"{temp:.1f}")
    start = device.conditions()
    if start.battery_level is not None and start.battery_level < BATTERY_FLOOR_PCT:
        raise DeviceLowBattery(device.serial, start.battery_level, BATTERY_FLOOR_PCT)
    rates: list[float] = []
    kept: list[dict] = []
    retakes = 0
    with device.forced_idle():
        while len(rates) < thresholds.warmup + thresholds.runs:
            before = device.conditions()
            one = llm.generate(thresholds.prompt, updater=updater, mode=mode, seq_len=seq_len)
            assert one.tokens_per_s is not None, "the runner wrote no inference_speed.txt"
            after = device.conditions()
            throttled = before.throttling or after.throttling
            if throttled and len(rates) >= thresholds.warmup and retakes < MAX_RETAKES:
                retakes += 1
                if limit is not None:
                    device.wait_cool(limit, farm.options.cool_timeout_s)
                continue
            rates.append(one.tokens_per_s)
            kept.append({"before": before.to_json(), "after": after.to_json(), "throttled": throttled})
    measured = rates[thresholds.warmup:]
    record_measurement("tok_s", "tok/s", measured, updater=updater, mode=mode, seq_len=seq_len,
                       threshold=threshold, conditions=kept[thresholds.warmup:])
    llm.record(f"tok_s.{updater}", f"{statistics.median(measured):.2f}")
    llm.record(f"tok_s_runs.{updater}", " ".join(f"{r:.2f}" for r in measured))
    llm.record(f"retaken_runs.{updater}", retakes)
    llm.record(f"throttled_runs.{updater}", sum(k["throttled"] for k in kept[thresholds.warmup:]))
    return measured


def _where(device) -> str:
    figures = {Timing.HOST_CPU: ", virtual: host-CPU figures",
               Timing.SIMULATED: ", virtual: SIMULATED phone figures, not measured"}.get(device.timing, "")
    return f"{device.serial} ({device.soc}{figures})"


def test_min_throughput(llm, farm, thresholds, record_measurement, point):
    mode, seq_len, updater = point
    rule = thresholds.minimum(llm.device.soc, mode, seq_len, updater)
    if rule is None:
        pytest.skip(f"{thresholds.path}: no minimum for {llm.device.soc} at {mode}/{seq_len}/{updater}")
    if updater not in llm.updaters:
        pytest.skip(f"runner dialect {llm.bundle.runner_dialect!r} has no {updater}")
    runs = measure(llm, farm, thresholds, record_measurement, mode=mode, seq_len=seq_len,
                   updater=updater, threshold=rule.tok_s)
    llm.record("threshold_tok_s", rule.tok_s)
    problem = below_minimum(runs, rule.tok_s)
    assert problem is None, f"{updater} {mode} seq_len {seq_len} on {_where(llm.device)}: {problem}"


def test_relative_throughput(llm, farm, thresholds, record_measurement, point):
    rule = thresholds.relative_rule(llm.device.soc, point)
    if rule is None:
        pytest.skip(f"{thresholds.path}: no relative rule for {llm.device.soc}")
    missing = [u for u in (rule.faster, rule.slower) if u not in llm.updaters]
    if missing:
        pytest.skip(f"runner dialect {llm.bundle.runner_dialect!r} has no {', '.join(missing)}")
    fast = measure(llm, farm, thresholds, record_measurement, mode=rule.mode, seq_len=rule.seq_len,
                   updater=rule.faster)
    slow = measure(llm, farm, thresholds, record_measurement, mode=rule.mode, seq_len=rule.seq_len,
                   updater=rule.slower)
    problem = too_slow(rule.faster, fast, rule.slower, slow, rule.max_slowdown_pct)
    assert problem is None, f"{problem} ({rule.mode}, seq_len {rule.seq_len}) on {_where(llm.device)}"
