"""Throughput: tokens/second against the bundle's thresholds (minimums per SoC, mode, seq_len and
updater: warm-up runs first, then N measured runs, all kept; the median is compared) and as A/B
tests on the same device: the relative rules between updaters, and --farm-ab-baseline's bundle
against the bundle under test (interleaved blocks until the interval of the ratio decides, see
farm/results/ab.py). Phones are first left to cool under --farm-max-temp, and so are simulated phones
(virtual devices with a phone's timing model, whose heat builds with their runs); host-timed virtual
devices are not. Each device's figures are marked with where they come from: measured on a phone,
the host CPU of a virtual device, or SIMULATED by a virtual device's phone model. Every measured run of every
point is recorded raw (``record_measurement``) for the results store and the regression gate."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from farm.ab import Sampling, Variant, sample_blocks
from farm.bundle.tokens import DEFAULT_SEQ_LEN, context_len
from farm.device.conditions import pinned_governors
from farm.execute.deploy import deploy
from farm.execute.run import runner_dialect
from farm.execute.runprofile import RunRequest
from farm.results.ab import ABVerdict, BoundVerdict, against_bound
from farm.results.checks import below_minimum, too_slow
from farm.vocab import Timing, Updater
from ptefarm_fixtures import DeviceLowBattery, ensure_run
from ptefarm_suites.cases import RelativeRule, Thresholds

from ._data import bundle_thresholds

PHONE_MAX_TEMP_C = 40.0
BATTERY_FLOOR_PCT = 20   # under it a phone may cap its clocks to save power
MAX_RETAKES = 2          # throttled runs re-taken per point, at most
pytestmark = [pytest.mark.throughput, pytest.mark.release]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "baseline_point" in metafunc.fixturenames:
        _parametrize_baseline(metafunc)
        return
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


def _parametrize_baseline(metafunc: pytest.Metafunc) -> None:
    points = _baseline_points(metafunc)
    metafunc.parametrize("baseline_point", points, ids=[f"{m}-{s}-{u}" for m, s, u in points])


def _ready_to_measure(llm, farm) -> float | None:
    """Cool the device (phones and simulated phones) and check the battery floor before a point;
    returns the temperature limit it was cooled under (None: a host-timed virtual device)."""
    device = llm.device
    limit = farm.options.max_temp_c or (None if device.timing == Timing.HOST_CPU else PHONE_MAX_TEMP_C)
    if limit is not None:
        temp = device.wait_cool(limit, farm.options.cool_timeout_s)
        llm.record("battery_temp_c", "unknown" if temp is None else f"{temp:.1f}")
    start = device.conditions()
    if start.battery_level is not None and start.battery_level < BATTERY_FLOOR_PCT:
        raise DeviceLowBattery(device.serial, start.battery_level, BATTERY_FLOOR_PCT)
    return limit


def measure(llm, farm, thresholds: Thresholds, record_measurement, *, mode: str, seq_len: int,
            updater: str, threshold: float | None = None) -> list[float]:
    """The measured runs (warm-ups dropped), recorded raw with the conditions of each: one runner
    invocation per run, each its own process as upstream's CI runs it. Not --num_iters:
    qnn_llama_runner v1.0.1 keeps its position across iterations, so the second iteration of a run
    that filled its seq_len aborts.

    The device is cooled first (phones and simulated phones), must be above the battery floor, and
    is held in forced deep idle while measuring, its CPU governors pinned to performance where it
    allows (a root shell; recorded either way). A measured run during which the device reported
    throttling (thermal status MODERATE or above, before or after it) is re-taken after a cool-down,
    at most ``MAX_RETAKES`` times per point; a run kept throttled says so in its conditions."""
    device = llm.device
    limit = _ready_to_measure(llm, farm)
    rates: list[float] = []
    kept: list[dict] = []
    retakes = 0
    with device.forced_idle(), pinned_governors(device.adb) as pinning:
        llm.record("governor_pinning", pinning)
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


def ab_on_device(llm, farm, thresholds: Thresholds, record_measurement, a: Variant, b: Variant, *,
                 decided=None) -> Sampling:
    """An A/B of ``a`` and ``b`` (both deployed) on the test's device: cooled and above the battery
    floor first, as ``measure``; then interleaved blocks in forced deep idle (farm.ab.sample_blocks)
    under the thresholds' [ab] design, ``warmup`` blocks dropped. Both variants' runs are recorded
    raw with their conditions, and the interval in the test's properties."""
    device = llm.device
    _ready_to_measure(llm, farm)
    seed = random.randrange(2**32) if farm.options.ab_seed is None else farm.options.ab_seed
    got = sample_blocks([device.adb], a, b, thresholds.ab, seed=seed, run_timeout_s=llm.timeout_s,
                        warmup=thresholds.warmup, **({} if decided is None else {"decided": decided}))
    for v in (a, b):
        mine = [x for x in got.samples if x.variant == v.label]
        r = v.request
        record_measurement("tok_s", "tok/s", [x.tok_s for x in mine], updater=r.updater, mode=r.mode,
                           seq_len=r.seq_len, conditions=[x.conditions for x in mine])
        llm.record(f"tok_s.{v.label}", f"{statistics.median(x.tok_s for x in mine):.2f}")
        llm.record(f"tok_s_runs.{v.label}", " ".join(f"{x.tok_s:.2f}" for x in mine))
        llm.record(f"throttled_runs.{v.label}", sum(x.throttled for x in mine))
    res = got.result
    llm.record("ab.a", a.describe())
    llm.record("ab.b", b.describe())
    if res.ratio is not None:
        llm.record("ab.ratio", f"{res.ratio:.4f}")
        llm.record("ab.interval", f"[{res.low:.4f}, {res.high:.4f}] at {1 - res.level:.2%}")
    llm.record("ab.verdict", res.verdict)
    llm.record("ab.blocks", res.blocks)
    llm.record("ab.stopped", got.stopped)
    llm.record("ab.seed", seed)
    llm.record("governor_pinning", got.pinning.get(device.serial, "?"))
    return got


def _interval(res) -> str:
    if res.ratio is None:
        return f"no interval ({res.reason})"
    return f"{res.ratio:.4f} [{res.low:.4f}, {res.high:.4f}] ({1 - res.level:.1%}, {res.blocks} blocks)"


def test_relative_throughput(llm, farm, thresholds, record_measurement, point):
    """A rule "`faster` at most N % slower than `slower`" as an A/B on this device: A = `slower`,
    B = `faster`, blocks until the interval of B / A is wholly above 1 - N % (met) or wholly below
    it (missed). Still undecided at the design's last block, the estimate decides, and says so."""
    rule = thresholds.relative_rule(llm.device.soc, point)
    if rule is None:
        pytest.skip(f"{thresholds.path}: no relative rule for {llm.device.soc}")
    missing = [u for u in (rule.faster, rule.slower) if u not in llm.updaters]
    if missing:
        pytest.skip(f"runner dialect {llm.bundle.runner_dialect!r} has no {', '.join(missing)}")
    base = RunRequest(prompts=[thresholds.prompt], mode=rule.mode, updater=rule.slower, seq_len=rule.seq_len)
    a = Variant(rule.slower, llm.bundle, base)
    b = Variant(rule.faster, llm.bundle, replace(base, updater=rule.faster))
    bound = 1 - rule.max_slowdown_pct / 100
    got = ab_on_device(llm, farm, thresholds, record_measurement, a, b,
                       decided=lambda r: against_bound(r, bound) != BoundVerdict.UNDECIDED)
    llm.record("ab.bound", f"{bound:.4f}")
    llm.record("ab.rule", against_bound(got.result, bound))
    if llm.device.timing == Timing.SIMULATED:
        # The phone model was given each updater's figures: the rule then checks the A/B on the
        # effect it was handed, and says so wherever its verdict is read.
        llm.record("ab.evidence", "none: SIMULATED figures, the phone model's own data; this checks "
                                  "the comparison on a known effect, only a phone's run tests the rule")
    problem = too_slow(rule.faster, rule.slower, got.result, rule.max_slowdown_pct)
    assert problem is None, f"{problem} ({rule.mode}, seq_len {rule.seq_len}) on {_where(llm.device)}"


def _baseline_points(metafunc) -> list:
    th = bundle_thresholds(metafunc.config)
    run = ensure_run(metafunc.config)
    if th is not None and th.baseline_points:
        return [(p.mode, p.seq_len, p.updater) for p in th.baseline_points]
    modes = run.bundle.modes
    mode = "hybrid" if "hybrid" in modes else sorted(modes)[0]
    return [(mode, min(DEFAULT_SEQ_LEN, context_len(run.bundle)), Updater.SMART_MASK.value)]


@pytest.mark.gate
def test_against_baseline_bundle(llm, farm, thresholds, record_measurement, baseline_point):
    """--farm-ab-baseline: the baseline bundle (A, the main branch's build) against --farm-bundle
    (B, the pull request's) on this device, in interleaved blocks until the interval of B / A decides
    (farm/results/ab.py). Fails when B is slower beyond the design's minimum effect; "same",
    "faster" and "undecided" pass, each said in the properties."""
    baseline = farm.baseline_bundle
    if baseline is None:
        pytest.skip("no --farm-ab-baseline bundle to compare with")
    mode, seq_len, updater = baseline_point
    if updater not in llm.updaters:
        pytest.skip(f"runner dialect {llm.bundle.runner_dialect!r} has no {updater}")
    if mode not in baseline.modes:
        pytest.skip(f"the baseline bundle {baseline.name!r} has no mode {mode!r}")
    deploy(llm.device.adb, baseline)  # beside the bundle under test: each has its own workspace
    if updater not in runner_dialect(llm.device.adb, baseline).updaters:
        pytest.skip(f"the baseline bundle {baseline.name!r}'s runner has no {updater}")
    th = thresholds or Thresholds(path=Path("(none)"), warmup=1, runs=3, prompt="Once upon a time",
                                  minimums=(), relative=())  # the [ab] design's defaults
    request = RunRequest(prompts=[th.prompt], mode=mode, updater=updater, seq_len=seq_len)
    a, b = Variant("baseline", baseline, request), Variant("candidate", llm.bundle, request)
    got = ab_on_device(llm, farm, th, record_measurement, a, b)
    llm.record("ab.baseline_bundle", f"{baseline.name} ({farm.baseline_manifest})")
    res = got.result
    assert res.verdict != ABVerdict.SLOWER, (
        f"throughput regression against the baseline bundle {baseline.name!r}: {llm.bundle.name!r} / "
        f"baseline = {_interval(res)}, slower beyond {th.ab.min_effect:.1%} "
        f"({mode}/{updater}, seq_len {seq_len}) on {_where(llm.device)}")

