"""The updater comparison's verdict on given outputs: where two runs first differ, and that one output
being a prefix of the other is a divergence, never an agreement (a runner that stopped early has not
shown that it agrees)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from farm.execute import compare as compare_mod
from farm.execute.compare import UPDATER_PAIR, Comparison, compare_updaters
from farm.execute.run import RunResult
from farm.execute.runprofile import RunRequest


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


@pytest.mark.parametrize("by_text", [False, True], ids=["token ids", "text"])
def test_two_runs_that_produced_nothing_never_agree(by_text):
    """Two runs without outputs (no text at all, or none generated) are not an agreement, whichever
    way the comparison goes."""
    nothing = (None, None) if by_text else ([], [])
    c = comparison(*nothing, by_text=by_text)
    assert not c.agree
    unit = "output text" if by_text else "generated token ids"
    assert c.explain() == (f"SmartMask and ShiftPointer do not agree on S1 (kv): both produced no {unit} "
                           f"(empty outputs are never an agreement)")


# -- what the verdict says: the contract of the message -----------------------------------------

@pytest.mark.parametrize("c, message", [
    (comparison([1, 2, 3], [1, 2, 3]), "SmartMask and ShiftPointer agree on 3 ids"),
    (comparison(b"four", b"four", by_text=True), "SmartMask and ShiftPointer agree on 4 text"),
    (comparison([1, 2, 3, 4, 5, 6, 7], [1, 9, 3, 4, 5, 6, 7]),
     "SmartMask and ShiftPointer diverge at token ids index 1 on S1 (kv): [2, 3, 4, 5, 6] vs [9, 3, 4, 5, 6]"),
    (comparison(b"abc", b"abd", by_text=True),
     "SmartMask and ShiftPointer diverge at output text index 2 on S1 (kv): b'c' vs b'd'"),
    (comparison([], [4]), "SmartMask and ShiftPointer do not agree on S1 (kv): SmartMask produced no "
                          "generated token ids (empty outputs are never an agreement)"),
    (comparison(b"text", b"", by_text=True), "SmartMask and ShiftPointer do not agree on S1 (kv): "
                                             "ShiftPointer produced no output text (empty outputs are "
                                             "never an agreement)"),
    (Comparison("S1", "hybrid", "p", 16, {UPDATER_PAIR[0]: result(UPDATER_PAIR[0], ids=[1])}),
     "no result for ShiftPointer on S1 (hybrid): nothing to compare"),
    (Comparison("S2", "kv", "p", 16), "no result for SmartMask and ShiftPointer on S2 (kv): nothing to compare"),
], ids=["agree ids", "agree text", "diverge ids", "diverge text", "first empty", "second empty",
        "one missing", "both missing"])
def test_the_verdict_says_which_updaters_on_which_device_and_where(c, message):
    assert c.explain() == message


# -- compare_updaters: both updaters, one request ----------------------------------------------

class RecordedRuns:
    """Stands in for farm.execute.run.run: records each call and answers with a fixed result."""

    def __init__(self):
        self.calls: list[tuple[object, object, RunRequest, float]] = []

    def __call__(self, device, bundle, request: RunRequest, *, timeout: float) -> RunResult:
        self.calls.append((device, bundle, request, timeout))
        return result(request.updater, ids=[1, 2, 3])


@pytest.fixture
def runs(monkeypatch) -> RecordedRuns:
    recorded = RecordedRuns()
    monkeypatch.setattr(compare_mod, "run", recorded)
    monkeypatch.setattr(compare_mod, "takes_flag", lambda device, bundle, flag: flag in RUNNER_FLAGS)
    return recorded


DEVICE = SimpleNamespace(serial="S9")
BUNDLE = SimpleNamespace(name="b", modes={"kv": SimpleNamespace(eval_mode=0),
                                          "hybrid": SimpleNamespace(eval_mode=1)})
RUNNER_FLAGS = {"dump_logits_path"}  # what the stand-in runner's --help lists


@pytest.mark.parametrize("base", [None, RunRequest(prompts=["other", "prompts"], mode="hybrid", seq_len=8,
                                                   temperature=0.8, system_prompt="be brief", seed=7,
                                                   num_iters=3, extra_args=["--x", "1"])],
                         ids=["default request", "from a base request"])
def test_both_updaters_run_the_same_greedy_request_with_the_callers_timeout(runs, base):
    c = compare_updaters(DEVICE, BUNDLE, mode="kv", prompt="Once upon", seq_len=64, timeout=42.0, base=base)
    expected = replace(base or RunRequest(prompts=[]), prompts=["Once upon"], mode="kv", seq_len=64,
                       temperature=0.0, dump_logits=True)
    assert [(d, b, t) for d, b, _, t in runs.calls] == [(DEVICE, BUNDLE, 42.0)] * 2
    assert [r for _, _, r, _ in runs.calls] == [replace(expected, updater=u) for u in UPDATER_PAIR]
    assert (c.serial, c.mode, c.prompt, c.seq_len) == ("S9", "kv", "Once upon", 64)
    assert {u: r.updater for u, r in c.results.items()} == {u: u for u in UPDATER_PAIR}
    assert c.agree and c.explain() == "SmartMask and ShiftPointer agree on 3 ids"


@pytest.mark.parametrize("mode, flags, dumped", [("kv", {"dump_logits_path"}, True),
                                                 ("hybrid", {"dump_logits_path"}, False),
                                                 ("kv", set(), False)],
                         ids=["kv mode", "hybrid: upstream refuses", "runner without the flag"])
def test_logits_are_asked_for_where_the_runner_can_dump_them(runs, monkeypatch, mode, flags, dumped):
    monkeypatch.setattr(compare_mod, "takes_flag", lambda device, bundle, flag: flag in flags)
    compare_updaters(DEVICE, BUNDLE, mode=mode, prompt="p", seq_len=8)
    assert [r.dump_logits for _, _, r, _ in runs.calls] == [dumped, dumped]


# -- logits: identical inputs give identical logits ------------------------------------------------

VOCAB = 6


def with_logits(updater: str, ids: list[int], rows: np.ndarray | None, *, n_prompt: int = 3,
                dtype: str = "float32") -> RunResult:
    r = result(updater, ids=ids)
    r.observers = [{"prompt_tokens": n_prompt, "generated_tokens": len(ids)}]
    if rows is not None:
        r.logits, r.logits_dtype = rows.astype(dtype).tobytes(), dtype
    return r


def logits_comparison(a_rows, b_rows, ids=(5, 6, 7, 8), **kwargs) -> Comparison:
    first, second = UPDATER_PAIR
    return Comparison(serial="S1", mode="kv", prompt="p", seq_len=16, results={
        first: with_logits(first, list(ids), a_rows, **kwargs),
        second: with_logits(second, list(ids), b_rows, **kwargs)})


def rows(n: int = 7) -> np.ndarray:  # 3 prompt rows + 4 decode rows, values of a real model's size
    return (np.arange(n * VOCAB, dtype=np.float32).reshape(n, VOCAB) * 1.37 + 8000.0)


def test_identical_logits_agree_and_say_so():
    c = logits_comparison(rows(), rows())
    assert c.agree and c.logits.identical and c.logits.max_ulp == 0
    assert c.explain() == ("SmartMask and ShiftPointer agree on 4 ids; logits: 7 rows, max |diff| 0 "
                           "(0 ulp, tolerance 2); no difference")


def test_a_rounding_difference_within_the_tolerance_agrees_and_is_reported_where_it_starts():
    b = rows()
    b[4, 2] = np.nextafter(b[4, 2], np.float32(np.inf))  # 1 ulp, at the second decode step
    c = logits_comparison(rows(), b)
    assert c.agree and c.logits.max_ulp == 1
    assert c.logits_summary().endswith("first difference at decode step 1")


@pytest.mark.parametrize("row, step", [(1, "prompt token 1"), (5, "decode step 2")])
def test_logits_that_differ_past_the_tolerance_fail_though_every_token_agrees(row, step):
    b = rows()
    b[row, 0] += 0.25  # far more than a rounding: a cache entry that is not what it should be
    c = logits_comparison(rows(), b)
    assert c.tokens_agree and not c.agree
    assert c.logits.first_differing_row == row
    message = c.explain()
    assert message.startswith("SmartMask and ShiftPointer agree on 4 ids on S1 (kv), but their logits "
                              f"differ from {step} on: max |diff| 0.25")
    assert "tolerance 2" in message


def test_the_tolerance_is_in_ulp_so_it_holds_for_logits_of_any_size():
    small = rows() / 8000.0  # logits around 1: 5 ulp there is a far smaller |diff| than at 8000
    b = small.copy()
    b[6, 3] = np.float32(b[6, 3]) + 5 * np.spacing(np.float32(b[6, 3]))
    c = logits_comparison(small, b)
    assert not c.agree and c.logits.max_ulp == 5 and c.logits.first_differing_row == 6


def test_quantized_logits_are_compared_in_steps():
    q = (rows() - 7000).astype(np.uint16)
    b = q.copy()
    b[3, 1] += 5
    assert logits_comparison(q, q.copy(), dtype="uint16").agree
    c = logits_comparison(q, b, dtype="uint16")
    assert not c.agree and c.logits.max_ulp == 5 and "decode step 0" in c.explain()


def test_one_run_without_its_logits_is_never_an_agreement():
    c = logits_comparison(rows(), None)
    assert c.tokens_agree and not c.agree
    assert c.explain().endswith("but only SmartMask dumped its logits")


def test_a_run_that_dumped_fewer_rows_disagrees():
    c = logits_comparison(rows(), rows()[:6])
    assert not c.agree
    assert "not 7 whole rows" in c.explain()


def test_neither_run_dumping_compares_tokens_alone():
    c = logits_comparison(None, None)
    assert c.agree and c.logits is None and c.logits_summary() == "not dumped"
    assert c.explain() == "SmartMask and ShiftPointer agree on 4 ids"


def test_a_token_divergence_also_says_where_the_logits_first_differed():
    b = rows()
    b[3, 0] += 0.01  # the logits drift at decode step 0, the tokens only later
    first, second = UPDATER_PAIR
    c = Comparison(serial="S1", mode="kv", prompt="p", seq_len=16, results={
        first: with_logits(first, [5, 6, 7, 8], rows()), second: with_logits(second, [5, 6, 9, 8], b)})
    assert not c.agree and c.first_divergence() == 2
    assert "first difference at decode step 0" in c.explain()


def test_a_comparison_judged_before_its_results_were_all_in_is_judged_again_on_them():
    """The fixture fills the results one updater at a time: a verdict asked in between must not be
    kept for the finished comparison (it had no logits to compare yet)."""
    first, second = UPDATER_PAIR
    b = rows()
    b[5, 0] += 0.25
    c = Comparison(serial="S1", mode="kv", prompt="p", seq_len=16,
                   results={first: with_logits(first, [5, 6, 7, 8], rows())})
    assert not c.agree and c.logits is None
    c.results[second] = with_logits(second, [5, 6, 7, 8], b)
    assert not c.agree and c.logits.first_differing_row == 5
    c.results[second] = with_logits(second, [5, 6, 7, 8], rows())
    assert c.agree


def test_logits_of_another_row_count_say_how_many_each_run_dumped():
    """The observers count the rows (eval_mode 0: one a prompt token and decode step): a run whose
    dump holds another count than the other's is a disagreement, with both counts named."""
    first, second = UPDATER_PAIR
    longer = with_logits(second, [5, 6, 7, 8], rows(8))
    longer.observers = [{"prompt_tokens": 4, "generated_tokens": 4}]
    c = Comparison(serial="S1", mode="kv", prompt="p", seq_len=16,
                   results={first: with_logits(first, [5, 6, 7, 8], rows()), second: longer})
    assert not c.agree
    assert c.explain().endswith("but SmartMask dumped 7 logits rows and ShiftPointer 8")


@pytest.mark.parametrize("dumped", list(UPDATER_PAIR))
def test_the_summary_names_the_one_run_that_dumped(dumped):
    first, second = UPDATER_PAIR
    c = logits_comparison(rows() if dumped == first else None, rows() if dumped == second else None)
    assert c.logits_summary() == f"only {dumped} dumped"


def test_a_step_is_named_as_the_first_updaters_run_counts_it():
    first, second = UPDATER_PAIR
    b = rows()
    b[2, 0] += 0.25
    results = {first: with_logits(first, [5, 6, 7, 8], rows(), n_prompt=3),
               second: with_logits(second, [5, 6, 7, 8], b)}
    results[second].observers = [{"prompt_tokens": 2, "generated_tokens": 5}]  # the same 7 rows
    c = Comparison(serial="S1", mode="kv", prompt="p", seq_len=16, results=results)
    assert "differ from prompt token 2 on" in c.explain()


def test_a_run_without_a_prompt_count_names_the_row():
    b = rows()
    b[2, 0] += 0.25
    c = logits_comparison(rows(), b)
    for r in c.results.values():
        r.observers = [{"generated_tokens": 7}]
    assert "differ from row 2 on" in c.explain()


def test_a_runner_given_runs_each_of_the_updaters_asked_and_nothing_else(runs):
    """The plugin's llm.compare passes its own generate and its bundle's updaters (a v1.4 runner has
    SmartMask only): the comparison runs those, through the runner given, never farm.execute.run."""
    seen: list[RunRequest] = []

    def runner(request: RunRequest) -> RunResult:
        seen.append(request)
        return result(request.updater, ids=[4, 5])

    c = compare_updaters(DEVICE, BUNDLE, mode="hybrid", prompt="p", seq_len=8, updaters=["SmartMask"],
                         dump_logits=False, runner=runner)
    assert [r.updater for r in seen] == ["SmartMask"] and runs.calls == []
    assert [r.dump_logits for r in seen] == [False] and list(c.results) == ["SmartMask"]
