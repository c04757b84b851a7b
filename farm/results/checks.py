"""The suites' verdicts on what they measured, as plain functions: each returns None when the check
holds, else the failure's message. The suites assert on these; tests/results/test_checks.py pins them,
so a verdict that quietly loosens (the best run instead of the median, a golden compared only as far
as the runner got) fails a test before it passes a merge. They live in the library, beside the gate,
so that they are judged under the name they are imported by (mutation testing included)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from farm.errors import UsageError
from farm.results.ab import ABResult, BoundVerdict, against_bound


def below_minimum(runs: Sequence[float], minimum: float) -> str | None:
    """The median of the measured runs against the minimum: one lucky run proves nothing."""
    if not runs:
        return f"no measured run to compare with the minimum {minimum:g}"
    median = statistics.median(runs)
    if median >= minimum:
        return None
    return (f"median {median:.1f} tok/s < minimum {minimum:g} "
            f"(runs: {', '.join(f'{r:.1f}' for r in runs)})")


def too_slow(faster: str, slower: str, result: ABResult, max_slowdown_pct: float) -> str | None:
    """Whether the updater meant to be faster is more than ``max_slowdown_pct`` % slower than the other,
    from an A/B of the two (A = ``slower``, B = ``faster``): the interval of B / A wholly below the
    bound misses it; one wholly at or above meets it; one across the bound (undecided after the
    design's last block) leaves it to the estimate, and the message says so."""
    bound = 1 - max_slowdown_pct / 100
    if result.ratio is None:  # the design always gives an interval by its last block (ABConfig)
        raise UsageError(f"{faster} against {slower}: no interval after {result.blocks} blocks "
                         f"({result.reason}): the A/B design gives too few blocks")
    verdict = against_bound(result, bound)
    if verdict == BoundVerdict.MEETS:
        return None
    if verdict == BoundVerdict.UNDECIDED and result.ratio >= bound:
        return None
    interval = "" if result.low is None else f" [{result.low:.4f}, {result.high:.4f}]"
    return (f"{faster} is more than {max_slowdown_pct:g}% slower than {slower}: {faster} / {slower} = "
            f"{result.ratio:.4f}{interval} over {result.blocks} blocks, bound {bound:.4f}"
            + (" (undecided: the interval spans the bound, the estimate is below it)"
               if verdict == BoundVerdict.UNDECIDED else ""))


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
