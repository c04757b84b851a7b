"""Change points over history: the runs where a point's throughput moved, over the stored runs (the
nightly history by default).

Each point (SoC, metric, mode, seq_len, updater) is a series of per-run medians in run order. ruptures'
PELT (a maintained library; exact segmentation under a penalty) splits the log of that series into
segments of constant level. The penalty is BIC-like, ``3 * log(n) * sigma^2``, with ``sigma`` the
run-to-run noise estimated robustly from successive differences (MAD / 0.6745 / sqrt 2), so a series
twice as noisy needs a step twice as large. Each candidate step is then checked as Hunter (MongoDB's
change-point tool) does: a Welch t-test of the runs' samples on either side (within the neighbouring
segments) must give p < ``alpha``, and the step must be at least ``min_effect`` of the level before
it; a step that fails either is dropped, so a lone slow run is not a change.

Runs whose figures are not measured (host-CPU or simulated) form series of their own: a change is
never called across a switch between a phone and a model.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from farm.errors import UsageError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Change", "PointSeries", "RunPoint", "find_changes"]

MIN_SEGMENT = 2  # runs: a step needs two runs on each side


@dataclass(frozen=True)
class RunPoint:
    """One run's samples at one point."""

    run_id: str
    started: float
    samples: tuple[float, ...]
    timing: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


@dataclass
class PointSeries:
    soc: str
    metric: str
    mode: str
    seq_len: int
    updater: str
    unit: str
    timing: str
    runs: list[RunPoint] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.soc} {self.mode}/{self.seq_len}/{self.updater} {self.metric}" + \
            (f" ({self.timing})" if self.timing and self.timing != "measured" else "")


@dataclass(frozen=True)
class Change:
    series: str
    index: int          # the first run of the new level
    run_id: str
    before: float       # median of the segment's run medians before and after
    after: float
    delta: float        # relative: after / before - 1
    p_value: float

    def to_json(self) -> dict:
        return {"point": self.series, "run_id": self.run_id, "index": self.index, "before": self.before,
                "after": self.after, "delta": self.delta, "p_value": self.p_value}


def noise_sigma(levels: np.ndarray) -> float:
    """Run-to-run noise of a series (log scale), robust to the steps themselves."""
    import numpy as np  # here, not at the top: the store imports this module in every xdist worker

    if len(levels) < 3:
        return 0.0
    diffs = np.diff(levels)
    mad = float(np.median(np.abs(diffs - np.median(diffs))))
    return mad / 0.6745 / math.sqrt(2)


def find_changes(series: PointSeries, *, alpha: float = 0.01, min_effect: float = 0.03,
                 floor_sigma: float = 0.002) -> list[Change]:
    """The changes in one point's series, oldest first (see the module)."""
    import numpy as np
    import ruptures
    from scipy.stats import ttest_ind

    if not 0 < alpha < 1 or not 0 <= min_effect < 1:
        raise UsageError(f"change points: alpha {alpha} must be in (0, 1), min effect {min_effect} in [0, 1)")
    runs = series.runs
    if len(runs) < 2 * MIN_SEGMENT:
        return []
    levels = np.log([r.median for r in runs])
    sigma = max(noise_sigma(levels), floor_sigma)
    penalty = 3 * math.log(len(levels)) * sigma ** 2
    ends = ruptures.Pelt(model="l2", min_size=MIN_SEGMENT, jump=1).fit(levels.reshape(-1, 1)).predict(pen=penalty)
    bounds = [0, *ends]
    changes = []
    for i in range(1, len(bounds) - 1):
        left, at, right = bounds[i - 1], bounds[i], bounds[i + 1]
        before = [v for r in runs[left:at] for v in r.samples]
        after = [v for r in runs[at:right] for v in r.samples]
        b = statistics.median(r.median for r in runs[left:at])
        a = statistics.median(r.median for r in runs[at:right])
        delta = a / b - 1
        p = float(ttest_ind(after, before, equal_var=False).pvalue) if len(before) > 1 and len(after) > 1 else 1.0
        if abs(delta) >= min_effect and p < alpha:
            changes.append(Change(series.label, at, runs[at].run_id, b, a, delta, p))
    return changes
