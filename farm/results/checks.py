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


def lookahead_mismatch(hybrid: Sequence[int], lookahead: Sequence[int], ngram: int) -> str | None:
    """Lookahead decoding at temperature 0 must write hybrid mode's greedy tokens: all of them, in
    order. Upstream's loop checks seq_len once per step and a step can accept up to ngram - 1 tokens
    (lhd_token_generator.cpp:228), so it may write that many more, never fewer."""
    hybrid, lookahead = list(hybrid), list(lookahead)
    if not hybrid:
        return "hybrid mode generated no tokens: nothing to check lookahead decoding against"
    n = len(hybrid)
    for i, (want, got) in enumerate(zip(hybrid, lookahead)):
        if want != got:
            return (f"lookahead decoding diverges from hybrid mode at generated token {i}: "
                    f"{lookahead[i:i + 5]} vs {hybrid[i:i + 5]}")
    if len(lookahead) < n:
        return (f"lookahead decoding stopped after {len(lookahead)} of hybrid mode's {n} generated "
                f"tokens")
    if len(lookahead) > n + ngram - 1:
        return (f"lookahead decoding wrote {len(lookahead) - n} tokens past hybrid mode's {n}; one "
                f"step accepts at most ngram - 1 = {ngram - 1}")
    return None
