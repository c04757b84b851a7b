"""The suites' verdicts (farm/results/checks.py) on measured values: medians, not the best run; goldens
matched to their end, not as far as the runner got."""

from __future__ import annotations

import pytest

from farm.errors import UsageError
from farm.results.ab import ABResult, ABVerdict
from farm.results.checks import (
    below_minimum,
    golden_ids_mismatch,
    golden_text_mismatch,
    lookahead_mismatch,
    too_slow,
)


def test_a_minimum_is_judged_on_the_median_not_the_best_run():
    assert below_minimum([10.0, 11.0, 95.0], 50.0) == ("median 11.0 tok/s < minimum 50 "
                                                       "(runs: 10.0, 11.0, 95.0)")
    assert below_minimum([49.0, 60.0, 61.0], 50.0) is None
    assert below_minimum([50.0], 50.0) is None  # the minimum itself passes
    assert below_minimum([49.9], 50.0) is not None


def test_a_minimum_with_no_run_is_never_met():
    assert below_minimum([], 1.5) == "no measured run to compare with the minimum 1.5"


def _ab(ratio, low, high, blocks=12):
    return ABResult(ABVerdict.UNDECIDED, ratio, low, high, 0.05, blocks)


def test_a_relative_rule_is_judged_on_the_interval_of_the_ratio():
    # SmartMask / ShiftPointer against "at most 10 % slower" (bound 0.9)
    assert too_slow("SmartMask", "ShiftPointer", _ab(0.95, 0.91, 0.99), 10.0) is None
    assert too_slow("SmartMask", "ShiftPointer", _ab(0.91, 0.90, 0.93), 10.0) is None  # at the bound
    problem = too_slow("SmartMask", "ShiftPointer", _ab(0.85, 0.84, 0.87), 10.0)
    assert problem == ("SmartMask is more than 10% slower than ShiftPointer: SmartMask / ShiftPointer = "
                       "0.8500 [0.8400, 0.8700] over 12 blocks, bound 0.9000")
    assert too_slow("SmartMask", "ShiftPointer", _ab(0.89, 0.80, 0.8999), 10.0) is not None


def test_an_interval_across_the_bound_leaves_it_to_the_estimate_and_says_so():
    assert too_slow("SmartMask", "ShiftPointer", _ab(0.92, 0.85, 0.99), 10.0) is None
    problem = too_slow("SmartMask", "ShiftPointer", _ab(0.88, 0.80, 0.95), 10.0)
    assert problem is not None and "undecided" in problem
    with pytest.raises(UsageError, match="too few blocks"):  # never judged without an interval
        too_slow("SmartMask", "ShiftPointer", _ab(None, None, None, 3), 10.0)


@pytest.mark.parametrize("generated", [[5, 6], [5], []])
def test_a_run_that_stopped_before_the_goldens_end_does_not_match_it(generated):
    assert golden_ids_mismatch(generated, [5, 6, 7]) is not None


def test_golden_ids_are_a_prefix_of_what_was_generated():
    assert golden_ids_mismatch([5, 6, 7, 8, 9], [5, 6, 7]) is None
    assert golden_ids_mismatch([5, 6, 8, 8], [5, 6, 7]) == "generated ids [5, 6, 8] do not start with the golden [5, 6, 7]"


def test_golden_text_is_a_prefix():
    assert golden_text_mismatch("Once upon a time, a fox", "Once upon a time,") is None
    assert golden_text_mismatch("Once upon", "Once upon a time,") is not None
    assert golden_text_mismatch("Twice upon a time,", "Once") is not None


def test_a_golden_text_mismatch_shows_the_output_up_to_40_characters_past_the_golden():
    """Enough of the output to see where it went its own way, not the whole generation."""
    output = "Twice " + "x" * 60
    assert golden_text_mismatch(output, "Once") == (f"output {output[:44]!r} does not start with the "
                                                    f"golden 'Once'")
    assert golden_text_mismatch("Twice", "Once") == "output 'Twice' does not start with the golden 'Once'"


HYBRID = [5, 6, 7, 8, 9]


@pytest.mark.parametrize("lookahead, problem", [
    (HYBRID, None),
    (HYBRID + [10, 11], None),  # ngram 3: a last step may accept two tokens past seq_len
    (HYBRID + [10, 11, 12], "lookahead decoding wrote 3 tokens past hybrid mode's 5; one step accepts "
                            "at most ngram - 1 = 2"),
    (HYBRID[:4], "lookahead decoding stopped after 4 of hybrid mode's 5 generated tokens"),
    ([5, 6, 0, 8, 9], "lookahead decoding diverges from hybrid mode at generated token 2: [0, 8, 9] vs "
                      "[7, 8, 9]"),
    ([4] + HYBRID[1:], "lookahead decoding diverges from hybrid mode at generated token 0: [4, 6, 7, 8, "
                       "9] vs [5, 6, 7, 8, 9]"),
    ([], "lookahead decoding stopped after 0 of hybrid mode's 5 generated tokens"),
], ids=["equal", "overrun within a step", "overrun past a step", "short", "diverges", "first token",
        "nothing"])
def test_lookahead_must_write_every_greedy_token_of_hybrid_mode(lookahead, problem):
    assert lookahead_mismatch(HYBRID, lookahead, ngram=3) == problem


def test_lookahead_against_an_empty_hybrid_run_is_never_a_match():
    assert lookahead_mismatch([], [], ngram=3) == ("hybrid mode generated no tokens: nothing to check "
                                                   "lookahead decoding against")


def test_a_lookahead_divergence_shows_five_tokens_of_each_from_where_it_starts():
    hybrid = list(range(10, 30))
    lookahead = hybrid[:3] + [99] + hybrid[4:]
    assert lookahead_mismatch(hybrid, lookahead, ngram=3) == (
        "lookahead decoding diverges from hybrid mode at generated token 3: [99, 14, 15, 16, 17] vs "
        "[13, 14, 15, 16, 17]")
