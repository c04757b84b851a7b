"""Both sides against one corpus (corpus.toml): the farm's parsers of a runner's output, and the host
runner farm-llama-runner, checked against what qnn_llama_runner v1.0.1 writes in each case.

(a) parsers: farm/execute/run.py (observer lines, inference_speed.txt, completeness) and suites'
    generated_text (the echo stripped off outputs.txt), run over every corpus example;
(b) the host runner: its templates, end markers, observer line, speed formatting and, for every whole
    run of the corpus, the bytes its command line writes (stdout, outputs.txt, inference_speed.txt),
    then a few checks on the real engine (the tiny reference bundle).
"""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest

from farm.errors import RunIncomplete
from farm.execute.run import RunResult, check_complete, decode_rate, parse_observers, parse_speed, prefill_rate
from farm.execute.runprofile import RunnerCommand
from tests.conformance.corpus import (
    CORPUS,
    EOS_MARKERS,
    FAMILIES,
    MESSAGES,
    OBSERVER,
    OBSERVER_KEYS,
    echo_of,
    entries,
    ident,
)
from tests.support.runner import end_on

RUNS = entries("run")
EXAMPLES = entries("observer.example")


def each(kind: str):
    return pytest.mark.parametrize("case", entries(kind), ids=ident)


def observer_values(line: str) -> dict:
    """The corpus's own reading of an observer line: its JSON, keys in the order written."""
    assert line.startswith(OBSERVER["prefix"])
    return json.loads(line[len(OBSERVER["prefix"]):])


def result(stdout: str = "", outputs: bytes | None = b"x") -> RunResult:
    return RunResult(serial="s", bundle="b", mode="kv", updater="SmartMask", command="c", exit_code=0,
                     stdout=stdout, stderr="", duration_s=1.0, text_bytes=outputs,
                     text=None if outputs is None else outputs.decode())


# -- the corpus itself ------------------------------------------------------------------------------

def test_the_corpus_is_consistent():
    """Its examples agree with its own rules, so that a test against it tests against upstream."""
    assert set(EOS_MARKERS) == set(FAMILIES) == {e["family"] for e in entries("echo")}
    for example in EXAMPLES:
        assert tuple(observer_values(example["line"])) == OBSERVER_KEYS
        assert observer_values(example["line"]) == example["values"]
    for run in RUNS:
        calls = run.get("call", [])
        assert run["outputs"] == "".join(c["echo"] + c["text"] for c in calls)
        assert run["stdout"] == "".join(CORPUS["eos"]["newline"] * c["eos"] + c["observer"] + "\n"
                                        for c in calls)
        loads = {(observer_values(c["observer"])["model_load_start_ms"],
                  observer_values(c["observer"])["model_load_end_ms"]) for c in calls}
        assert len(loads) <= 1  # RUN:369-373: loaded once
        sampling = [observer_values(c["observer"])["aggregate_sampling_time_ms"] for c in calls]
        assert sampling == sorted(sampling)  # RUN:112: never reset, it accumulates
        pos = 0  # the Runner's cur_pos_, carried over from call to call (RUN:423,447)
        for c in calls:
            stats = observer_values(c["observer"])
            assert stats["prompt_tokens"] >= 1 and pos + stats["prompt_tokens"] < run["seq_len"]  # RUN:409-412
            pos += stats["prompt_tokens"] + stats["generated_tokens"]
            # TOK:261: the loop runs to seq_len - 1 unless an end token stops it first
            assert pos <= run["seq_len"] - 1 and (c["eos"] or pos == run["seq_len"] - 1)
        if not run["prompts"] and "tokenized_ids" not in run:
            assert "speed" not in run and not calls


# -- (a) the farm's parsers -------------------------------------------------------------------------

@each("observer.example")
def test_parse_observers_reads_an_observer_line(case):
    (parsed,) = parse_observers(case["line"] + "\n")
    assert parsed == case["values"]
    assert tuple(parsed) == OBSERVER_KEYS  # the order written, STATS:85-99
    assert all(type(v) is int for v in parsed.values())  # long / int64_t, never floats


@each("run")
def test_parse_observers_gives_one_stats_per_call(case):
    """One line per call (RUN:454), in call order, the EOS newline (TOK:321) before a line ignored."""
    parsed = parse_observers(case["stdout"])
    assert parsed == [observer_values(c["observer"]) for c in case.get("call", [])]
    assert [tuple(p) for p in parsed] == [OBSERVER_KEYS] * len(parsed)


def test_parse_observers_among_the_log():
    """stdout interleaved with log lines a wrapper may merge in: still one stats per observer line."""
    run = next(r for r in RUNS if r["name"] == "num_iters_repeat_the_prompts")
    noisy = "".join(f"I 00:00:0{i}.000 executorch:runner.cpp:449] Sequence length reached!\n{line}\n"
                    for i, line in enumerate(run["stdout"].splitlines()))
    assert parse_observers(noisy) == parse_observers(run["stdout"])


@each("speed")
def test_parse_speed_reads_inference_speed_txt(case):
    value = parse_speed(case["written"])
    assert value == pytest.approx(case["value"], rel=5e-6)  # 6 significant digits written
    assert math.isinf(value) == math.isinf(case["value"])


@each("double")
def test_parse_speed_reads_what_operator_shift_writes(case):
    value = parse_speed(case["written"])
    if math.isnan(case["value"]):
        assert math.isnan(value)
    else:
        assert value == pytest.approx(case["value"], rel=5e-6)


@each("run")
def test_parse_speed_of_a_runs_speed_file(case):
    """The file holds the last call's figure; no call, no file (parse_speed(None))."""
    if "speed" not in case:
        assert parse_speed(None) is None
        return
    last = observer_values(case["call"][-1]["observer"])
    n, start, end = ((last["generated_tokens"], last["inference_start_ms"], last["inference_end_ms"])
                     if last["generated_tokens"] else
                     (last["prompt_tokens"], last["inference_start_ms"], last["prompt_eval_end_ms"]))
    assert parse_speed(case["speed"]) == pytest.approx(n / (end - start) * 1000, rel=5e-6)


@each("observer.example")
def test_prefill_rate_is_upstreams(case):
    """STATS:125-132: prompt tokens over prompt_eval_end - inference_start."""
    assert prefill_rate(case["values"]) == pytest.approx(case["prefill_tok_s"])


@pytest.mark.parametrize("case", [e for e in EXAMPLES if "decode_tok_s" in e], ids=ident)
def test_decode_rate_is_upstreams(case):
    """STATS:134-143: generated tokens over inference_end - prompt_eval_end."""
    assert decode_rate(case["values"]) == pytest.approx(case["decode_tok_s"])


@pytest.mark.parametrize("case", [e for e in entries("echo") if not e["system_prompt"]], ids=ident)
def test_generated_text_strips_the_echo(case):
    """suites' generated_text: what follows the formatted prompt, for every family (the echo is the
    formatted string, QLR:99-180 / RUN:415-417, with no BOS text)."""
    from suites.test_correctness import generated_text

    generation = "Paris is the capital of France."
    assert generated_text(case["echo"] + generation, case["prompt"], case["family"]) == generation


@pytest.mark.parametrize("case", [r for r in RUNS if len(r.get("call", [])) == 1 and r["prompts"]
                                  and (not r["system_prompt"] or r["family"] in ("llama2", "qwen2_5"))],
                         ids=ident)
def test_generated_text_of_a_single_call_run(case):
    """generated_text formats without a system prompt (llama2 and qwen2_5 never use one)."""
    from suites.test_correctness import generated_text

    calls = case["call"]
    assert generated_text(case["outputs"], case["prompts"][0], case["family"]) == calls[0]["text"]


@each("run")
def test_check_complete_takes_a_run_with_output_and_refuses_one_without(case):
    """QLR:206,236: outputs.txt exists even when nothing ran; empty, the run is incomplete."""
    command = RunnerCommand(argv=[], shell="", out_dir="/data/run", outputs={"outputs": "outputs.txt"})
    run = result(case["stdout"], case["outputs"].encode())
    if case.get("call"):
        check_complete(run, command)
    else:
        with pytest.raises(RunIncomplete, match="empty outputs.txt"):
            check_complete(run, command)


# -- (b) the host runner ----------------------------------------------------------------------------

def test_host_families_are_the_corpus_families():
    from farm.model.template import FAMILIES as HOST_FAMILIES

    assert list(HOST_FAMILIES) == FAMILIES


@each("echo")
def test_host_formats_each_familys_echo(case):
    from farm.model.template import format_prompt

    assert format_prompt(case["prompt"], case["system_prompt"], case["family"]) == case["echo"]


@pytest.mark.parametrize("family", FAMILIES)
def test_host_end_markers_are_upstreams(family):
    from farm.model.template import FAMILIES as HOST_FAMILIES

    assert (HOST_FAMILIES[family].end_marker or "") == EOS_MARKERS[family]


def test_host_observer_keys_are_upstreams():
    from farm.runner.engine import OBSERVER_KEYS as HOST_KEYS

    assert HOST_KEYS == OBSERVER_KEYS


def stats_of(values: dict):
    from farm.runner.engine import Stats

    return Stats(**{k: v for k, v in values.items() if k != "SCALING_FACTOR_UNITS_PER_SECOND"})


@each("observer.example")
def test_host_prints_the_observer_line(case):
    assert stats_of(case["values"]).observer_line() == case["line"]


@each("speed")
def test_host_writes_the_speed(case):
    from farm.runner.engine import cpp_double

    stats = stats_of({k: case[k] for k in ("prompt_tokens", "generated_tokens", "inference_start_ms",
                                           "prompt_eval_end_ms", "inference_end_ms")})
    assert stats.tokens_per_second() == case["value"]
    assert cpp_double(stats.tokens_per_second()) == case["written"]


@each("double")
def test_host_writes_a_double_as_operator_shift(case):
    from farm.runner.engine import cpp_double

    assert cpp_double(case["value"]) == case["written"]


def run_argv(run: dict) -> list[str]:
    argv = ["--model_path", "m.pte", "--tokenizer_path", "t.model", "--decoder_model_version",
            run["family"], "--system_prompt", run["system_prompt"], "--seq_len", str(run["seq_len"])]
    if "argv" in run:
        return argv + run["argv"]
    argv += ["--num_iters", str(run["num_iters"])]
    for prompt in run["prompts"]:
        argv += ["--prompt", prompt]
    return argv


@each("run")
def test_host_runner_writes_each_run(case, tmp_path, monkeypatch, capsys):
    """farm-llama-runner's command line around an engine that generates the corpus's calls: it must
    format and send each call's echo, in order, and write the corpus's stdout, outputs.txt and
    inference_speed.txt byte for byte."""
    from farm.runner import cli, engine

    calls = list(case.get("call", []))
    sent = []

    class Scripted:
        def __init__(self, model_path, tokenizer_path, eval_mode, io_cls, version, **kwargs):
            from farm.model.template import format_prompt

            self.template = SimpleNamespace(format=lambda p, s: format_prompt(p, s, version))

        def generate(self, prompt, seq_len, temperature, gen, tokens=None):
            call = calls[len(sent)]
            sent.append((prompt, tokens))
            return engine.Generation(prompt_ids=[], generated_ids=[], text=(call["echo"] + call["text"]).encode(),
                                     stats=stats_of(observer_values(call["observer"])),
                                     reached_eos=call["eos"], newlines=int(call["eos"]))

    monkeypatch.setattr(engine, "LlamaRunner", Scripted)
    monkeypatch.chdir(tmp_path)
    if "tokenized_ids" in case:
        (tmp_path / "prompt.bin").write_bytes(np.array(case["tokenized_ids"], dtype=np.uint64).tobytes())
    assert cli.exit_code(run_argv(case)) == 0, capsys.readouterr().err
    tokens = case.get("tokenized_ids")
    assert sent == [(c["echo"], tokens) for c in calls]
    assert capsys.readouterr().out == case["stdout"]
    assert (tmp_path / "outputs.txt").read_bytes() == case["outputs"].encode()
    speed = tmp_path / "inference_speed.txt"
    if "speed" in case:
        assert speed.read_text() == case["speed"]
    else:
        assert not speed.exists()


# -- (b) the real engine (the tiny reference bundle) ------------------------------------------------

@pytest.fixture()
def tiny_runner(tiny_bundle):
    from tests.support.runner import make_runner

    return make_runner(tiny_bundle, "kv", "SmartMask", "llama3")


def test_host_decodes_each_piece_after_its_predecessor(tiny_runner, monkeypatch):
    """[pieces]: the prefill's token after itself (RUN:429-432), each later one after the previous."""
    calls = []
    piece = tiny_runner.template.piece

    def recording(token, prev=None):
        calls.append((token, prev))
        return piece(token, prev)

    monkeypatch.setattr(tiny_runner.template, "piece", recording)
    gen = tiny_runner.complete("Hello", 48)
    ids = gen.generated_ids
    assert CORPUS["pieces"]["first"] == "decode(cur, cur)" and CORPUS["pieces"]["later"] == "decode(prev, cur)"
    assert calls == [(ids[0], ids[0])] + list(zip(ids[1:], ids[:-1]))


def test_host_times_only_the_decode_loops_sampling(tiny_runner, monkeypatch):
    """[observer]: aggregate_sampling_time_ms times the decode loop's samples (TOK:295-298), not the
    prefill's (PP:341-343): with a clock that ticks once per reading, one ms per timed sample."""
    from farm.runner.timing import WallClock

    ticks = iter(range(10**9))
    clock = WallClock()
    clock.now_ms = lambda: next(ticks)  # the stats' clock (a simulated phone's, or the host's)
    monkeypatch.setattr(tiny_runner, "clock", clock)
    before = tiny_runner.stats.aggregate_sampling_time_ms
    gen = tiny_runner.complete("Hello", 48)
    assert gen.stats.aggregate_sampling_time_ms - before == gen.stats.generated_tokens


def test_host_runner_two_turns_follow_the_corpus_rules(kv, tmp_path, monkeypatch, capsys):
    """The real engine, two --prompt turns, the first stopped by an end token: one observer line per
    call in the corpus's layout, the EOS newline before it, the load times repeated, sampling time
    accumulating, outputs.txt each call's echo then its pieces, the second turn after the first."""
    from farm.model.template import format_prompt
    from farm.model.tokenizer import load_tokenizer
    from farm.runner import cli

    pte, tok = kv
    monkeypatch.chdir(tmp_path)
    prompts = ["Hello", "Again"]
    argv = ["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0", "--decoder_model_version",
            "llama3", "--seq_len", "100", "--prompt", prompts[0], "--prompt", prompts[1],
            "--token_ids_path", "ids.json"]
    assert cli.exit_code(argv[:-4] + argv[-2:]) == 0  # the first turn alone, to learn its tokens
    end = json.loads((tmp_path / "ids.json").read_text())["generated_ids"][3]
    end_on(monkeypatch, end)
    capsys.readouterr()
    assert cli.exit_code(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    layout = ("\n?" + re.escape(OBSERVER["prefix"]) + r"\{"
              + ",".join(f'"{k}":\\d+' for k in OBSERVER_KEYS) + r"\}\n")
    assert re.fullmatch(f"({layout}){{2}}", out), out
    assert out.startswith(CORPUS["eos"]["newline"] + OBSERVER["prefix"])
    first, second = (observer_values(line) for line in out.split("\n") if line)
    assert (first["model_load_start_ms"], first["model_load_end_ms"]) == \
        (second["model_load_start_ms"], second["model_load_end_ms"])
    assert second["aggregate_sampling_time_ms"] >= first["aggregate_sampling_time_ms"]
    assert first["generated_tokens"] == 3  # the fourth token written, the third decode step
    ids = json.loads((tmp_path / "ids.json").read_text())
    runner_text = (tmp_path / "outputs.txt").read_bytes()
    echoes = [format_prompt(p, "", "llama3").encode() for p in prompts]
    tokenizer = load_tokenizer(tok)  # tiktoken: its pieces do not depend on the previous token
    split = first["generated_tokens"] + 1  # the prefill's token and the loop's
    pieces = [b"".join(map(tokenizer.piece, part))
              for part in (ids["generated_ids"][:split], ids["generated_ids"][split:])]
    assert runner_text == echoes[0] + pieces[0] + echoes[1] + pieces[1]
    assert len(ids["prompt_ids"]) == first["prompt_tokens"] + second["prompt_tokens"]
    bos = tokenizer.bos_id  # RUN:378: the BOS at position 0 only
    assert ids["prompt_ids"][0] == bos and ids["prompt_ids"][first["prompt_tokens"]] != bos


def test_host_messages_are_upstreams(kv, tmp_path, monkeypatch, capsys):
    from farm.runner import cli

    pte, tok = kv
    monkeypatch.chdir(tmp_path)
    base = ["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0"]
    (tmp_path / "p.bin").write_bytes(np.array([5, 6], dtype=np.uint64).tobytes())
    assert cli.exit_code(base + ["--tokenized_prompt", "p.bin", "--prompt", "x"]) == 2
    assert MESSAGES["both_prompts"] in capsys.readouterr().err
    assert cli.exit_code(["--eval_mode", "1", "--dump_logits_path", "l.bin", "--prompt", "x"]) == 2
    assert MESSAGES["dump_logits_mode"] in capsys.readouterr().err
    assert cli.exit_code(base + ["--prompt", "Once", "--seq_len", "2"]) == 2
    assert MESSAGES["seq_len_exceeded"] in capsys.readouterr().err
