import json

import pytest

from farm.execute.run import (
    RunResult,
    decode_rate,
    parse_observers,
    parse_speed,
    parse_token_ids,
    prefill_rate,
    stderr_tail,
)

STDOUT = """I 00:00:00.1 loading
PyTorchObserver {"prompt_tokens": 20, "generated_tokens": 41, "model_load_start_ms": 0, "model_load_end_ms": 50, "inference_start_ms": 1000, "prompt_eval_end_ms": 1200, "first_token_ms": 1200, "inference_end_ms": 3200}
PyTorchObserver {not json}
PyTorchObserver {"prompt_tokens": 20, "generated_tokens": 41, "inference_start_ms": 5000, "prompt_eval_end_ms": 5100, "first_token_ms": 5100, "inference_end_ms": 6100}
"""


def test_observer_lines_are_parsed_and_broken_ones_skipped():
    stats = parse_observers(STDOUT)
    assert len(stats) == 2
    assert stats[0]["generated_tokens"] == 41


def test_decode_and_prefill_rates_come_from_observer_timestamps():
    first = parse_observers(STDOUT)[0]
    assert decode_rate(first) == pytest.approx(41 / 2.0)  # 41 decode steps in the 2 s after prefill
    assert prefill_rate(first) == pytest.approx(20 / 0.2)
    assert decode_rate({"generated_tokens": 0, "prompt_eval_end_ms": 1, "inference_end_ms": 2}) is None
    assert decode_rate(None) is None and prefill_rate({}) is None


def test_result_uses_the_last_iteration():
    r = RunResult(serial="s", bundle="b", mode="kv", updater="SmartMask", command="c", exit_code=0,
                  stdout=STDOUT, stderr="", duration_s=1.0, observers=parse_observers(STDOUT))
    assert r.decode_tok_s == pytest.approx(41.0)
    d = r.to_dict()
    assert d["decode_tok_s"] == pytest.approx(41.0) and d["observers"][0]["prompt_tokens"] == 20


def test_speed_and_token_ids():
    assert parse_speed("123.5\n") == 123.5
    assert parse_speed("") is None and parse_speed("nan?") is None and parse_speed(None) is None
    assert parse_token_ids('{"prompt_ids": [1, 2], "generated_ids": [3]}') == ([1, 2], [3])
    assert parse_token_ids('{"prompt_ids": ["x"]}') == (None, None)
    assert parse_token_ids("garbage") == (None, None)


TIMES = {"prompt_tokens": 20, "generated_tokens": 5, "inference_start_ms": 1000, "prompt_eval_end_ms": 1250,
         "first_token_ms": 1250, "inference_end_ms": 2250}


@pytest.mark.parametrize("change, decode, prefill", [
    ({}, 5 / 1.0, 20 / 0.25),
    ({"generated_tokens": 1}, 1 / 1.0, 20 / 0.25),  # one decode step (v1.0.1 counts only those)
    ({"generated_tokens": 0}, None, 20 / 0.25),  # the prefill's token alone: no decode step
    ({"inference_end_ms": 1250}, None, 20 / 0.25),  # no time between the prompt's end and the end
    ({"prompt_eval_end_ms": 1000}, 5 / 1.25, None),  # no time for the prompt
    ({"generated_tokens": True, "prompt_tokens": False}, None, None),  # a bool is no count
    ({"generated_tokens": "5", "prompt_tokens": None}, None, None),
    ({"first_token_ms": None, "inference_start_ms": "0"}, 5 / 1.0, None),  # decode needs no first_token
    ({"inference_end_ms": [2250], "prompt_eval_end_ms": {}}, None, None),
], ids=["whole", "one step", "no step", "no decode time", "no prefill time", "bools", "strings",
        "missing starts", "odd ends"])
def test_rates_are_only_given_for_counts_and_times_that_make_one(change, decode, prefill):
    stats = {**TIMES, **change}
    assert decode_rate(stats) == (pytest.approx(decode) if decode else None)
    assert prefill_rate(stats) == (pytest.approx(prefill) if prefill else None)
    for key in TIMES:  # any one figure missing: no rate that needs it
        without = {k: v for k, v in stats.items() if k != key}
        if key in ("generated_tokens", "prompt_eval_end_ms", "inference_end_ms"):
            assert decode_rate(without) is None
        if key in ("prompt_tokens", "inference_start_ms", "prompt_eval_end_ms"):
            assert prefill_rate(without) is None


def test_token_ids_must_be_an_object_of_integer_lists():
    assert parse_token_ids("[1, 2]") == (None, None)
    assert parse_token_ids('"ids"') == (None, None)
    assert parse_token_ids('{"generated_ids": [4, 5]}') == (None, [4, 5])
    assert parse_token_ids("") == (None, None)


def _ran(stdout: str = "", stderr: str = "") -> RunResult:
    return RunResult(serial="s", bundle="b", mode="kv", updater="SmartMask", command="c", exit_code=1,
                     stdout=stdout, stderr=stderr, duration_s=1.0)


@pytest.mark.parametrize("stdout, stderr, tail", [
    ("out", "e1\n\n  e2  \n", "e1 | e2"),
    ("o1\no2\n", " \n", "o1 | o2"),  # stderr blank: stdout is all there is
    ("", "", "no output"),
    ("", "".join(f"line {i}\n" for i in range(9)), "line 4 | line 5 | line 6 | line 7 | line 8"),
    ("", "x" * 400 + "\nlast", "x" * 300 + " | last"),
], ids=["stderr", "stdout when stderr is blank", "nothing", "the last five", "long lines cut"])
def test_the_stderr_tail_is_the_last_lines_on_one_line(stdout, stderr, tail):
    assert stderr_tail(_ran(stdout, stderr)) == tail


def test_the_result_dict_carries_both_rates_and_no_bytes():
    r = RunResult(serial="s", bundle="b", mode="kv", updater="SmartMask", command="c", exit_code=0,
                  stdout="", stderr="", duration_s=1.0, text="hi", text_bytes=b"hi", observers=[TIMES])
    d = r.to_dict()
    assert d["decode_tok_s"] == pytest.approx(5.0) and d["prefill_tok_s"] == pytest.approx(80.0)
    assert "text_bytes" not in d and d["text"] == "hi" and d["local_dir"] is None
    assert json.loads(json.dumps(d)) == d
