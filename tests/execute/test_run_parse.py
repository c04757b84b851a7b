import pytest

from farm.execute.run import (
    RunResult,
    decode_rate,
    parse_observers,
    parse_speed,
    parse_token_ids,
    prefill_rate,
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
    assert decode_rate(first) == pytest.approx(40 / 2.0)  # 40 tokens after the first in 2 s
    assert prefill_rate(first) == pytest.approx(20 / 0.2)
    assert decode_rate({"generated_tokens": 1, "first_token_ms": 1, "inference_end_ms": 2}) is None
    assert decode_rate(None) is None and prefill_rate({}) is None


def test_result_uses_the_last_iteration():
    r = RunResult(serial="s", bundle="b", mode="kv", updater="SmartMask", command="c", exit_code=0,
                  stdout=STDOUT, stderr="", duration_s=1.0, observers=parse_observers(STDOUT))
    assert r.decode_tok_s == pytest.approx(40.0)
    d = r.to_dict()
    assert d["decode_tok_s"] == pytest.approx(40.0) and d["observers"][0]["prompt_tokens"] == 20


def test_speed_and_token_ids():
    assert parse_speed("123.5\n") == 123.5
    assert parse_speed("") is None and parse_speed("nan?") is None and parse_speed(None) is None
    assert parse_token_ids('{"prompt_ids": [1, 2], "generated_ids": [3]}') == ([1, 2], [3])
    assert parse_token_ids('{"prompt_ids": ["x"]}') == (None, None)
    assert parse_token_ids("garbage") == (None, None)
