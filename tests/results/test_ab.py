"""The A/B comparison (farm/results/ab.py): its estimate is the ratio, its interval covers as it says,
its verdicts follow their rules, and a broken estimator or interval is caught here."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from farm.errors import UsageError
from farm.results import ab
from farm.results.ab import ABConfig, ABVerdict, Block, compare, looks, walsh_interval


def _blocks(ratio: float, n: int, *, sigma: float = 0.01, seed: int = 0, devices: int = 2) -> list[Block]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a = 50.0 * math.exp(rng.gauss(0, sigma))
        b = 50.0 * ratio * math.exp(rng.gauss(0, sigma))
        out.append(Block(f"dev{i % devices}", a, b, rng.random() < 0.5))
    return out


def test_the_estimate_is_the_ratio_of_b_to_a():
    exact = [Block("d", 40.0, 38.0), Block("d", 50.0, 47.5), Block("e", 60.0, 57.0)]
    result = compare(exact, ABConfig(), level=0.5)
    assert result.ratio == pytest.approx(0.95)  # every block says 0.95: so must the estimate
    assert result.per_device == {"d": pytest.approx(0.95), "e": pytest.approx(0.95)}
    noisy = compare(_blocks(0.95, 200, sigma=0.02), ABConfig())
    assert noisy.ratio == pytest.approx(0.95, abs=0.005)
    assert noisy.low < noisy.ratio < noisy.high


def test_walsh_averages_are_averages():
    # median of pairwise means of (0, 1, 2, 10): the Hodges-Lehmann estimate, not the pairwise sums'
    centre, _, _ = walsh_interval(np.array([0.0, 1.0, 2.0, 10.0] * 5), 0.05)
    assert centre == pytest.approx(np.median([(x + y) / 2 for i, x in enumerate([0, 1, 2, 10] * 5)
                                              for y in ([0, 1, 2, 10] * 5)[i:]]))


@pytest.mark.parametrize("n", [8, 20, 60])
def test_the_interval_covers_as_often_as_it_says_on_heavy_tails(n):
    rng = np.random.default_rng(n)
    misses = sum(not (lo <= 0 <= hi) for lo, hi in (
        walsh_interval(rng.standard_t(3, size=n), 0.10)[1:] for _ in range(3000)))
    assert misses / 3000 <= 0.10 + 0.02  # 3000 trials: +-0.55 % sd at 10 %
    assert misses / 3000 >= 0.10 - 0.04  # and not a uselessly wide interval


def test_the_exact_critical_values_are_the_tables():
    # Wilcoxon signed-rank, two-sided 5 %: critical T is 8 at n = 10 and 52 at n = 20 (k = T + 1)
    assert ab._exact_k(10, 0.05) == 9 and ab._exact_k(20, 0.05) == 53
    assert ab._exact_k(5, 0.05) == 0 and walsh_interval(np.zeros(5), 0.05) is None


def test_verdicts_follow_their_rules():
    config = ABConfig(min_effect=0.02)
    assert compare(_blocks(0.90, 40), config).verdict == ABVerdict.SLOWER
    assert compare(_blocks(1.10, 40), config).verdict == ABVerdict.FASTER
    assert compare(_blocks(1.00, 60, sigma=0.005), config).verdict == ABVerdict.SAME
    # a real 1 % difference is smaller than the effect size: same, not slower
    assert compare(_blocks(0.99, 200, sigma=0.005), config).verdict == ABVerdict.SAME
    # too noisy to decide: neither within +-2 % nor clearly beyond
    wide = compare(_blocks(0.97, 8, sigma=0.05), config)
    assert wide.verdict == ABVerdict.UNDECIDED and wide.reason
    few = compare(_blocks(0.5, 3), config)
    assert few.verdict == ABVerdict.UNDECIDED and few.ratio is None and "cannot give an interval" in few.reason


def test_identical_variants_are_rarely_called_different():
    config = ABConfig()
    calls = [compare(_blocks(1.0, 24, sigma=0.03, seed=s), config).verdict for s in range(400)]
    assert sum(v in (ABVerdict.SLOWER, ABVerdict.FASTER) for v in calls) / 400 <= config.alpha


def test_looks_and_levels_of_the_design():
    assert looks(ABConfig(min_blocks=6, max_blocks=30, look_every=3)) == [6, 9, 12, 15, 18, 21, 24, 27, 30]
    assert looks(ABConfig(min_blocks=4, max_blocks=10, look_every=4)) == [4, 8, 10]
    assert looks(ABConfig(min_blocks=10, max_blocks=10, sequential=False)) == [10]
    assert ABConfig(min_blocks=6, max_blocks=30, look_every=3).alpha_per_look == pytest.approx(0.05 / 9)


@pytest.mark.parametrize("bad, message", [
    (dict(alpha=0), "alpha"), (dict(min_effect=0), "minimum effect"),
    (dict(min_blocks=0), "blocks"), (dict(min_blocks=5, max_blocks=4), "blocks"),
    (dict(look_every=0), "blocks"),
])
def test_a_bad_design_is_refused(bad, message):
    with pytest.raises(UsageError, match=message):
        ABConfig(**bad)


def test_a_run_without_a_figure_is_refused():
    with pytest.raises(UsageError, match="finite positive"):
        compare([Block("d", 0.0, 1.0)], ABConfig())


def test_a_broken_estimator_is_caught(monkeypatch):
    """The deliberately broken variant: Walsh sums instead of averages (the estimate's log doubled),
    the bug this module once had. The estimate test above must fail on it."""
    real = ab.walsh_averages
    monkeypatch.setattr(ab, "walsh_averages", lambda r: 2 * real(r))
    broken = compare([Block("d", 40.0, 38.0)] * 12, ABConfig(), level=0.5)
    assert broken.ratio != pytest.approx(0.95)


def test_a_design_that_could_never_decide_is_refused_for_its_devices():
    design = ABConfig(min_blocks=4, max_blocks=4, look_every=4)  # one look at alpha 5 %
    with pytest.raises(UsageError, match="max_blocks 4 on 1 device"):
        design.check_decidable(1)  # 4 values: the smallest p-value is 2 / 16
    design.check_decidable(2)  # 8 values: 2 / 256
