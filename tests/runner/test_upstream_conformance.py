"""farm-llama-runner writes what qnn_llama_runner v1.0.1 writes.

Each test cites the upstream line it transcribes (ExecuTorch, tag v1.0.1):
  QLR = examples/qualcomm/oss_scripts/llama/qnn_llama_runner.cpp
  RUN = examples/qualcomm/oss_scripts/llama/runner/runner.cpp
  TOK = examples/qualcomm/oss_scripts/llama/runner/token_generator.cpp
  STATS = extension/llm/runner/stats.h
The literals (echoes, observer keys, how a double is written, messages, families) are the conformance
corpus's, tests/conformance/corpus.toml, which the farm's parsers are tested against too.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from farm.model.llama import eager_generate
from farm.model.template import FAMILIES, format_prompt
from farm.runner import main as runner_main
from farm.runner.engine import OBSERVER_KEYS, Stats, cpp_double
from tests.conformance import corpus
from tests.support.runner import end_on, make_runner

CONTEXT = 128  # the tiny reference model's context length


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        runner_main.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def observers(stdout: str) -> list[tuple[str, dict]]:
    prefix = corpus.OBSERVER["prefix"]
    return [(line, json.loads(line[len(prefix):])) for line in stdout.splitlines()
            if line.startswith(prefix)]


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_one_llama3_prompt_writes_what_upstream_writes(tiny_bundle, kv, in_tmp, capsys):
    pte, tok = kv
    case = corpus.echo_of("llama3")
    code, out, err = run_cli(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0",
                              "--decoder_model_version", "llama3", "--prompt", case["prompt"],
                              "--seq_len", "64", "--token_ids_path", "ids.json"], capsys)
    assert code == 0, err
    ids = json.loads((in_tmp / "ids.json").read_text())
    text = (in_tmp / "outputs.txt").read_bytes()
    # QLR:108 / RUN:416: the echo is the formatted prompt string; the BOS is a token (RUN:378), not text.
    echo = case["echo"].encode()
    assert text.startswith(echo) and b"<|begin_of_text|>" not in text
    runner = make_runner(tiny_bundle, "kv", "SmartMask", "llama3")
    assert ids["prompt_ids"][0] == runner.tokenizer.bos_id
    # RUN:431, TOK:316: then the piece of every written token, the prefill's first.
    assert text == echo + b"".join(runner.template.piece(t) for t in ids["generated_ids"])
    ((line, stats),) = observers(out)
    # STATS:85-97: compact, in this key order, nothing else.
    assert line == corpus.OBSERVER["prefix"] + json.dumps(stats, separators=(",", ":"))
    assert tuple(stats) == OBSERVER_KEYS == corpus.OBSERVER_KEYS
    # TOK:261,326: generated_tokens counts the decode loop only, which stops at seq_len - 1.
    assert stats["prompt_tokens"] == len(ids["prompt_ids"])
    assert stats["prompt_tokens"] + stats["generated_tokens"] == 64 - 1
    assert len(ids["generated_ids"]) == stats["generated_tokens"] + 1
    # RUN:48-59: generated / (end - start) * 1000, written by operator<<.
    speed = stats["generated_tokens"] / (stats["inference_end_ms"] - stats["inference_start_ms"]) * 1000
    assert (in_tmp / "inference_speed.txt").read_text() == cpp_double(speed)


@pytest.mark.parametrize("value,written", [(e["value"], e["written"])
                                           for e in corpus.entries("double") + corpus.entries("speed")])
def test_speed_is_written_as_operator_shift_writes_a_double(value, written):
    """RUN:59: ``outfile << num_tok``."""
    assert cpp_double(value) == written


def test_speed_of_a_zero_interval_is_inf_and_of_no_generation_the_prompt_rate():
    # RUN:48-53: no generated token -> prompt tokens over the prompt time; a zero interval divides by 0.
    assert Stats(generated_tokens=5, inference_start_ms=7, inference_end_ms=7).tokens_per_second() == math.inf
    assert Stats(prompt_tokens=10, inference_start_ms=0, prompt_eval_end_ms=500,
                 inference_end_ms=9000).tokens_per_second() == 20.0


def test_defaults_are_upstreams(tiny_bundle, hybrid, in_tmp, capsys):
    """QLR:26-72: eval_mode 1, temperature 0, llama2: a hybrid .pte runs without --eval_mode."""
    pte, tok = hybrid
    code, out, err = run_cli(["--model_path", pte, "--tokenizer_path", tok, "--prompt", "Once upon",
                              "--seq_len", "40", "--token_ids_path", "ids.json"], capsys)
    assert code == 0, err
    ids = json.loads((in_tmp / "ids.json").read_text())
    assert (in_tmp / "outputs.txt").read_bytes().startswith(b"Once upon")  # llama2: the prompt as is
    again = make_runner(tiny_bundle, "hybrid", "SmartMask", "llama2").complete("Once upon", 40)
    assert ids["generated_ids"] == again.generated_ids  # greedy, as temperature 0 is


def test_seq_len_past_the_context_is_clamped(kv, in_tmp, capsys):
    """RUN:377: a --seq_len above the context length means the context length."""
    pte, tok = kv
    code, out, err = run_cli(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0",
                              "--prompt", "Once", "--seq_len", "4096"], capsys)
    assert code == 0, err
    ((_, stats),) = observers(out)
    assert stats["prompt_tokens"] + stats["generated_tokens"] == CONTEXT - 1


def test_only_separate_dash_dash_prompt_arguments_are_prompts(kv, in_tmp, capsys):
    """QLR:86-97: prompts are the values after an argument that is exactly --prompt; --prompt=X parses
    but runs nothing, so outputs.txt is empty and nothing is printed."""
    pte, tok = kv
    code, out, err = run_cli(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0",
                              "--prompt=Hello"], capsys)
    assert code == 0, err
    assert (in_tmp / "outputs.txt").read_bytes() == b"" and observers(out) == []
    assert not (in_tmp / "inference_speed.txt").exists()


def test_iterations_and_turns_continue_one_position(kv, in_tmp, capsys):
    """QLR:225-232 runs every prompt of every iteration on one runner; RUN:423,447 carry cur_pos_
    over, RUN:412 refuses a prompt that no longer fits: the second iteration of a run that filled
    its seq_len is refused, as upstream's ET_CHECK aborts it."""
    pte, tok = kv
    code, out, err = run_cli(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0",
                              "--prompt", "Once", "--seq_len", "48", "--num_iters", "2"], capsys)
    assert code == 2
    assert corpus.MESSAGES["seq_len_exceeded"] in err
    assert len(observers(out)) == 1


def test_a_second_turn_starts_where_the_first_ended_without_its_last_token(tiny_bundle, tiny_weights):
    """RUN:378 (no BOS after position 0), RUN:447 and TOK:326: the last token a turn wrote is never fed,
    so the next prompt's ids follow the fed ones directly; checked against the eager model."""
    runner = make_runner(tiny_bundle, "kv", "SmartMask", "llama2")
    runner.io.reset()
    gen = torch.Generator()
    first = runner.generate("Once upon a time", 24, 0.0, gen)
    assert runner.cur_pos == 24 - 1
    second = runner.generate(" there was", 60, 0.0, gen)
    assert second.prompt_ids[0] != runner.tokenizer.bos_id
    fed = first.prompt_ids + first.generated_ids[:-1] + second.prompt_ids
    assert second.generated_ids == eager_generate(tiny_weights, fed, 60)
    assert second.stats.generated_tokens == 60 - 1 - len(fed)


def test_end_of_sequence_is_looked_for_only_in_the_decode_loop(tiny_bundle):
    """TOK:320-324: the token prefill produced is never taken for an end token; the loop stops at the
    first end token it samples, having written it."""
    runner = make_runner(tiny_bundle, "kv", "SmartMask", "llama2")
    plain = runner.complete("Once upon a time", 60)
    first, later = plain.generated_ids[0], plain.generated_ids[5]
    runner.template.eos_ids = {first, later}
    stopped = runner.complete("Once upon a time", 60)
    stop_at = next(i for i, t in enumerate(plain.generated_ids[1:], 1) if t in {first, later})
    assert stopped.reached_eos and stopped.generated_ids == plain.generated_ids[:stop_at + 1]
    assert stopped.stats.generated_tokens == stop_at


def test_end_of_sequence_prints_a_newline(kv, in_tmp, capsys, monkeypatch):
    """TOK:321: printf("\\n") when the loop reaches an end token, before the observer line."""
    pte, tok = kv
    argv = ["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0", "--prompt", "Once",
            "--seq_len", "40", "--token_ids_path", "ids.json"]
    assert run_cli(argv, capsys)[0] == 0
    third = json.loads((in_tmp / "ids.json").read_text())["generated_ids"][3]
    end_on(monkeypatch, third)
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert out.startswith(corpus.CORPUS["eos"]["newline"] + corpus.OBSERVER["prefix"])


def test_special_tokens_in_prompt_text_are_encoded_as_specials(tiny_bundle):
    """Upstream's tiktoken encodes a special token written in the text as that token (the formatted
    prompt relies on it), a user's text included."""
    runner = make_runner(tiny_bundle, "kv", "SmartMask", "llama3")
    ids = runner.template.encode_turn("a<|eot_id|>b", "", first=True)
    eot = runner.tokenizer.special_tokens["<|eot_id|>"]
    assert ids.count(eot) == 2  # the user's and the template's


def test_a_tokenized_prompt_is_raw_uint64_ids_and_its_path_is_the_echo(kv, in_tmp, capsys):
    """RUN:383-397: the file's uint64 ids are the prompt, no BOS added; RUN:416 echoes the 'prompt',
    which is the path."""
    pte, tok = kv
    (in_tmp / "prompt.bin").write_bytes(np.array([5, 300, 17, 42], dtype=np.uint64).tobytes())
    code, out, err = run_cli(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0",
                              "--tokenized_prompt", "prompt.bin", "--seq_len", "30",
                              "--token_ids_path", "ids.json"], capsys)
    assert code == 0, err
    assert json.loads((in_tmp / "ids.json").read_text())["prompt_ids"] == [5, 300, 17, 42]
    assert (in_tmp / "outputs.txt").read_bytes().startswith(b"prompt.bin")
    code, _, err = run_cli(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0",
                            "--tokenized_prompt", "prompt.bin", "--prompt", "x"], capsys)
    assert code == 2 and corpus.MESSAGES["both_prompts"] in err


@pytest.mark.parametrize("version,system,prompt,expected", [  # QLR:99-180, get_formatted_prompt
    (e["family"], e["system_prompt"], e["prompt"], e["echo"]) for e in corpus.entries("echo")])
def test_every_family_formats_its_prompt_as_upstream(version, system, prompt, expected):
    assert format_prompt(prompt, system, version) == expected


def test_the_families_are_v1_0_1s():
    """RUN:106-125: the decoder model versions v1.0.1 accepts."""
    assert set(FAMILIES) == set(corpus.FAMILIES)
