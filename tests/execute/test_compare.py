"""The updater comparison's verdict on given outputs: where two runs first differ, and that one output
being a prefix of the other is a divergence, never an agreement (a runner that stopped early has not
shown that it agrees)."""

from __future__ import annotations

import pytest

from farm.execute.compare import UPDATER_PAIR, Comparison
from farm.execute.run import RunResult


def result(updater: str, ids: list[int] | None = None, text: bytes | None = None) -> RunResult:
    return RunResult(serial="S1", bundle="b", mode="kv", updater=updater, command="", exit_code=0,
                     stdout="", stderr="", duration_s=0.1, text_bytes=text,
                     text=None if text is None else text.decode(), generated_ids=ids)


def comparison(a, b, *, by_text: bool = False) -> Comparison:
    first, second = UPDATER_PAIR
    if by_text:
        results = {first: result(first, text=a), second: result(second, text=b)}
    else:
        results = {first: result(first, ids=a), second: result(second, ids=b)}
    return Comparison(serial="S1", mode="kv", prompt="p", seq_len=16, results=results)


@pytest.mark.parametrize("at", [0, 1, 4])
def test_the_first_divergence_is_the_index_of_the_first_differing_token(at):
    a = [10, 11, 12, 13, 14, 15]
    b = list(a)
    b[at] = 99
    c = comparison(a, b)
    assert not c.agree
    assert c.first_divergence() == at
    assert f"diverge at token ids index {at} " in c.explain()
    assert repr(a[at:at + 5]) in c.explain() and repr(b[at:at + 5]) in c.explain()


@pytest.mark.parametrize("shorter", ["first", "second"])
def test_one_output_a_prefix_of_the_other_is_a_divergence_at_the_shorter_ones_end(shorter):
    long, short = [1, 2, 3, 4, 5], [1, 2, 3]
    c = comparison(short, long) if shorter == "first" else comparison(long, short)
    assert not c.agree
    assert c.first_divergence() == 3
    assert "diverge at token ids index 3 " in c.explain()


def test_identical_outputs_agree_and_name_how_many():
    c = comparison([5, 6, 7], [5, 6, 7])
    assert c.agree and c.first_divergence() is None
    assert c.explain().endswith("agree on 3 ids")


def test_text_is_compared_when_a_runner_gives_no_token_ids():
    c = comparison(b"Once upon a time", b"Once upon a tide", by_text=True)
    assert c.compared_by == "output text"
    assert not c.agree and c.first_divergence() == 14
    assert comparison(b"Once upon", b"Once upon a", by_text=True).first_divergence() == 9
    assert comparison(b"same", b"same", by_text=True).agree


def test_token_ids_win_over_text_only_when_both_runs_have_them():
    first, second = UPDATER_PAIR
    c = Comparison("S1", "kv", "p", 16, {first: result(first, ids=[1, 2], text=b"ab"),
                                         second: result(second, ids=None, text=b"ab")})
    assert c.compared_by == "output text" and c.agree


@pytest.mark.parametrize("a, b", [([], []), ([], [1]), ([1], [])])
def test_an_empty_output_never_agrees(a, b):
    c = comparison(a, b)
    assert not c.agree
    assert "never an agreement" in c.explain()


def test_a_missing_updater_is_nothing_to_compare():
    first, _ = UPDATER_PAIR
    c = Comparison("S1", "kv", "p", 16, {first: result(first, ids=[1])})
    assert not c.agree and c.first_divergence() is None
    assert "nothing to compare" in c.explain()
