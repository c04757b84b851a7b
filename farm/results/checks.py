"""The suites' verdicts on what they measured, as plain functions: each returns None when the check
holds, else the failure's message. The suites assert on these; tests/results/test_checks.py pins them,
so a verdict that quietly loosens (the best run instead of the median, a golden compared only as far
as the runner got) fails a test before it passes a merge. They live in the library, beside the gate,
so that they are judged under the name they are imported by (mutation testing included)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def below_minimum(runs: Sequence[float], minimum: float) -> str | None:
    """The median of the measured runs against the minimum: one lucky run proves nothing."""
    if not runs:
        return f"no measured run to compare with the minimum {minimum:g}"
    median = statistics.median(runs)
    if median >= minimum:
        return None
    return (f"median {median:.1f} tok/s < minimum {minimum:g} "
            f"(runs: {', '.join(f'{r:.1f}' for r in runs)})")


def too_slow(faster: str, fast_runs: Sequence[float], slower: str, slow_runs: Sequence[float],
             max_slowdown_pct: float) -> str | None:
    """Whether the updater meant to be faster is more than ``max_slowdown_pct`` % slower than the other,
    median against median."""
    fast, slow = statistics.median(fast_runs), statistics.median(slow_runs)
    if fast >= slow * (1 - max_slowdown_pct / 100):
        return None
    return f"{faster} {fast:.1f} tok/s is more than {max_slowdown_pct:g}% slower than {slower} {slow:.1f} tok/s"


def golden_ids_mismatch(generated: Sequence[int], golden: Sequence[int]) -> str | None:
    """The generated ids must begin with every golden id: a run that stopped before the golden's end
    has not matched it."""
    got = list(generated[:len(golden)])
    if got == list(golden):
        return None
    return f"generated ids {got} do not start with the golden {list(golden)}"


def golden_text_mismatch(text: str, prefix: str) -> str | None:
    if text.startswith(prefix):
        return None
    return f"output {text[:len(prefix) + 40]!r} does not start with the golden {prefix!r}"
