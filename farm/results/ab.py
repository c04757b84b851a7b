"""A/B on the same devices: two variants (two bundles, or two runner flags of one bundle) measured in
interleaved blocks, compared within each device, combined across devices, with a confidence interval.

Why blocks of one A run and one B run, in a random order, on one device: what differs between devices
(unit-to-unit spread), between days and with the phone's heat cancels within a block, where a stored
baseline taken on another unit on another day carries all of it into the comparison. Each block gives
one paired log-ratio ``r = log(B) - log(A)``; blocks of every device are pooled (each is already a
within-device comparison).

The estimate is the Hodges-Lehmann estimate of the ratio ``B / A``: exp of the median of the Walsh
averages of the blocks' log-ratios; its confidence interval is the distribution-free one of the
Wilcoxon signed-rank test (order statistics of the Walsh averages). It is robust to the heavy tail of
phone timings (a background task spoils a run, not the verdict), and assumes only that a block's
log-ratio is symmetric about the true one, which randomizing the order within a block gives.

Verdicts, for a metric where larger is better (tok/s; ``ratio`` = B / A, ``d`` = ``min_effect``):

- ``same``: the interval lies inside (1 - d, 1 + d): any difference is smaller than the effect size;
- ``slower`` / ``faster``: the interval excludes 1 and the estimate is beyond 1 - d / 1 + d;
- ``undecided``: neither (too few blocks, or a difference near the effect size).

Sequential A/B looks at the blocks after each round and stops at the first decided verdict or when
the budget (blocks, or device seconds) is spent. Looking K times at level ``alpha`` each would call a
difference on identical variants more often than ``alpha``; each look uses ``alpha / K`` (Bonferroni:
conservative, and distribution-free as the interval is), so the whole run's false-alarm rate stays at
or under ``alpha``. ``bench/bench_gate.py`` measures it, with the power at 3, 5 and 10 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from statistics import NormalDist

import numpy as np

from farm.errors import UsageError

__all__ = ["ABConfig", "ABResult", "ABVerdict", "Block", "BoundVerdict", "against_bound", "compare", "looks",
           "walsh_interval"]


class ABVerdict(StrEnum):
    FASTER = "faster"
    SLOWER = "slower"
    SAME = "same"
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class ABConfig:
    """The design. ``alpha``: the whole run's chance of calling a difference between identical
    variants (faster or slower); ``min_effect``: a relative difference smaller than this is ``same``;
    ``min_blocks`` / ``max_blocks`` per device: where sequential looks start and must stop;
    ``look_every``: blocks per device between looks; ``sequential``: False looks once, at
    ``max_blocks`` (fixed N)."""

    alpha: float = 0.05
    min_effect: float = 0.02
    # Tuned with bench/bench_gate.py (two simulated SM8650 units): the first look at 4 blocks per
    # device decides a 5-10 % change; 4 looks keep the per-look alpha at 1.25 %, where 6..30 every 3
    # (9 looks) needed 6 blocks before any interval (x0.71 of fixed N, against x0.57 here).
    min_blocks: int = 4
    max_blocks: int = 16
    look_every: int = 4
    sequential: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise UsageError(f"A/B alpha must be in (0, 1), got {self.alpha}")
        if not (math.isfinite(self.min_effect) and 0 < self.min_effect < 1):
            raise UsageError(f"A/B minimum effect must be in (0, 100) %, got {self.min_effect * 100:g} %")
        if not (1 <= self.min_blocks <= self.max_blocks) or self.look_every < 1:
            raise UsageError(f"A/B blocks: need 1 <= min_blocks ({self.min_blocks}) <= max_blocks "
                             f"({self.max_blocks}) and look_every >= 1 ({self.look_every})")

    def check_decidable(self, devices: int) -> None:
        """Refuse a design whose last look could never give an interval on ``devices`` devices: the
        smallest two-sided p-value of the signed-rank test with n values is 2 / 2^n, which must be
        under the per-look alpha (n = max_blocks x devices)."""
        n = self.max_blocks * devices
        if 2 * 0.5 ** n >= self.alpha_per_look:
            raise UsageError(f"A/B blocks: max_blocks {self.max_blocks} on {devices} device(s) can never "
                             f"give an interval at alpha {self.alpha:g} over {self.n_looks} look(s); "
                             f"give more blocks")

    @property
    def n_looks(self) -> int:
        return len(looks(self))

    @property
    def alpha_per_look(self) -> float:
        return self.alpha / self.n_looks


def looks(config: ABConfig) -> list[int]:
    """The blocks per device after which the verdict is looked at."""
    if not config.sequential:
        return [config.max_blocks]
    at = list(range(config.min_blocks, config.max_blocks + 1, config.look_every))
    return at if at[-1] == config.max_blocks else [*at, config.max_blocks]


@dataclass(frozen=True)
class Block:
    """One block on one device: one run of each variant (the order it ran in is ``a_first``)."""

    serial: str
    a: float
    b: float
    a_first: bool = True

    @property
    def log_ratio(self) -> float:
        return math.log(self.b) - math.log(self.a)


@dataclass
class ABResult:
    verdict: ABVerdict
    ratio: float | None            # Hodges-Lehmann estimate of B / A
    low: float | None              # the interval, at confidence 1 - level
    high: float | None
    level: float                   # the alpha the interval was built at (per look)
    blocks: int
    per_device: dict[str, float] = field(default_factory=dict)  # serial -> its own estimate of B / A
    reason: str = ""

    def to_json(self) -> dict:
        return {"verdict": str(self.verdict), "ratio": self.ratio, "low": self.low, "high": self.high,
                "level": self.level, "blocks": self.blocks, "per_device": self.per_device,
                "reason": self.reason}


def walsh_averages(r: np.ndarray) -> np.ndarray:
    """The Walsh averages (r_i + r_j) / 2, i <= j, sorted."""
    walsh = ((r[:, None] + r[None, :]) / 2)[np.triu_indices(len(r))]
    walsh.sort()
    return walsh


def _interval(walsh: np.ndarray, n: int, alpha: float) -> tuple[float, float, float] | None:
    """Hodges-Lehmann estimate and (1 - alpha) signed-rank interval from the sorted Walsh averages of
    ``n`` values; None when so few values could never give an interval at that level."""
    m = len(walsh)
    # The signed-rank statistic's lower critical value: exact below 50 values, normal beyond.
    if n < 50:
        k = _exact_k(n, alpha)
    else:
        sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        k = int(math.floor(m / 2 - NormalDist().inv_cdf(1 - alpha / 2) * sd))
    if k < 1:
        return None
    return float(np.median(walsh)), float(walsh[k - 1]), float(walsh[m - k])


def walsh_interval(r: np.ndarray, alpha: float) -> tuple[float, float, float] | None:
    """Hodges-Lehmann estimate and the (1 - alpha) signed-rank interval of the centre of ``r``; None
    when so few values could never give an interval at that level."""
    return _interval(walsh_averages(r), len(r), alpha)


_EXACT: dict[tuple[int, float], int] = {}


def _exact_k(n: int, alpha: float) -> int:
    """The largest k with P(T <= k - 1) <= alpha / 2 under the signed-rank null (T: the sum of ranks
    of the positive values), so that [W_(k), W_(m-k+1)] covers with at least 1 - alpha."""
    key = (n, alpha)
    if key not in _EXACT:
        counts = np.zeros(n * (n + 1) // 2 + 1)
        counts[0] = 1.0
        for i in range(1, n + 1):  # the number of rank subsets with each sum
            counts[i:] = counts[i:] + counts[: len(counts) - i].copy()
        cdf = np.cumsum(counts) / 2.0 ** n
        _EXACT[key] = int(np.searchsorted(cdf, alpha / 2, side="right"))
    return _EXACT[key]


def compare(blocks: list[Block], config: ABConfig, *, level: float | None = None) -> ABResult:
    """The verdict on ``blocks`` (all devices), with its interval at ``level`` (default: the
    per-look alpha of the design)."""
    level = config.alpha_per_look if level is None else level
    if any(not (b.a > 0 and b.b > 0 and math.isfinite(b.a) and math.isfinite(b.b)) for b in blocks):
        raise UsageError("A/B: every run needs a finite positive figure")
    per_device: dict[str, list[float]] = {}
    for b in blocks:
        per_device.setdefault(b.serial, []).append(b.log_ratio)
    own = {s: math.exp(float(np.median(v))) for s, v in sorted(per_device.items())}
    r = np.array([b.log_ratio for b in blocks], dtype=float)
    walsh = walsh_averages(r)  # once: both intervals below are order statistics of it
    found = _interval(walsh, len(r), level) if len(r) else None
    if found is None:
        return ABResult(ABVerdict.UNDECIDED, None, None, None, level, len(blocks), own,
                        f"{len(blocks)} block(s) cannot give an interval at {1 - level:.3%}")
    centre, lo, hi = (math.exp(x) for x in found)
    d = config.min_effect
    # Equivalence as TOST decides it: two one-sided tests at the level, i.e. the 1 - 2 * level
    # interval within +-d (calling "same" wrongly needs a difference of d or more, on one side).
    tost = _interval(walsh, len(r), min(2 * level, 0.5))
    eq_lo, eq_hi = (math.exp(tost[1]), math.exp(tost[2])) if tost is not None else (lo, hi)
    if 1 - d < eq_lo and eq_hi < 1 + d:
        verdict, why = ABVerdict.SAME, f"the {1 - 2 * level:.1%} interval lies within +-{d:.1%} (TOST)"
    elif hi < 1 and centre <= 1 - d:
        verdict, why = ABVerdict.SLOWER, f"the interval is below 1 and the estimate {centre - 1:+.1%} beyond -{d:.1%}"
    elif lo > 1 and centre >= 1 + d:
        verdict, why = ABVerdict.FASTER, f"the interval is above 1 and the estimate {centre - 1:+.1%} beyond +{d:.1%}"
    else:
        verdict, why = ABVerdict.UNDECIDED, "the interval does not decide at this effect size"
    return ABResult(verdict, centre, lo, hi, level, len(blocks), own, why)


class BoundVerdict(StrEnum):
    """A relative rule's verdict (B / A must be at least ``bound``), from the interval."""

    MEETS = "meets"          # the whole interval is at or above the bound
    MISSES = "misses"        # the whole interval is below it
    UNDECIDED = "undecided"  # the bound is inside the interval (or no interval yet)


def against_bound(result: ABResult, bound: float) -> BoundVerdict:
    """Whether the ratio B / A is at least ``bound`` (a rule such as "SmartMask at most 10 % slower
    than ShiftPointer": bound 0.9), as the interval shows it."""
    if result.low is None or result.high is None:
        return BoundVerdict.UNDECIDED
    if result.low >= bound:
        return BoundVerdict.MEETS
    if result.high < bound:
        return BoundVerdict.MISSES
    return BoundVerdict.UNDECIDED
