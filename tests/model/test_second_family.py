"""The second reference bundle (farm export --model tiny-qwen2_5): the qwen2_5 decoder model version with
an HF tokenizer.json. farm-llama-runner runs it as qnn_llama_runner v1.0.1 runs a qwen2_5 bundle, and the
plugin's prompt fitting and the suites' cases work for it as for llama3 (the issue: a qwen2_5 bundle's
`chunk+1` case was a bad-input error and every run failed with "unsupported 'qwen2_5'")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.bundle.tokens import check_prompt_fits, count_tokens, fit_prompt
from farm.errors import UsageError
from farm.model.llama import eager_generate
from farm.model.tokenizer import load_tokenizer
from farm.runner import main as runner_main
from ptefarm_suites.cases import case_points, load_cases, resolve_tokens
from tests.support.runner import make_runner, paths

SUITES_CASES = Path(__file__).resolve().parents[2] / "suites" / "data" / "correctness.toml"


@pytest.fixture(scope="module")
def bundle(qwen_bundle):
    return bundle_mod.load(qwen_bundle)


@pytest.fixture(scope="module")
def tokenizer(bundle):
    return load_tokenizer({f.name: f.path for f in bundle.files}[bundle.tokenizer])


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        runner_main.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_the_second_bundle_is_qwen2_5_with_an_hf_tokenizer_json(bundle, tokenizer):
    assert bundle.decoder_model_version == "qwen2_5" and bundle.tokenizer == "tokenizer.json"
    assert tokenizer.format == "hf" and tokenizer.n_words == bundle.model["vocab_size"]
    assert set(tokenizer.special_tokens) == {"<|endoftext|>", "<|im_start|>"}


@pytest.mark.parametrize("mode", ["kv", "hybrid"])
def test_farm_llama_runner_echoes_a_qwen2_5_prompt_as_it_is_and_generates_to_seq_len(
        qwen_bundle, qwen_weights, tokenizer, mode, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    pte, tok = paths(qwen_bundle, mode)
    prompt = "Once upon a time, Über 日本 <|im_start|>"
    code, out, err = run_cli(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode",
                              0 if mode == "kv" else 1, "--decoder_model_version", "qwen2_5",
                              "--prompt", prompt, "--seq_len", 48, "--token_ids_path", "ids.json"], capsys)
    assert code == 0, err
    ids = json.loads((tmp_path / "ids.json").read_text())
    # qnn_llama_runner.cpp get_formatted_prompt: qwen2_5 sends the prompt as it is; the special token
    # written in it is encoded as that token; this HF file adds no BOS.
    assert ids["prompt_ids"] == tokenizer.encode(prompt, bos=True) == tokenizer.encode(prompt, bos=False)
    assert tokenizer.special_tokens["<|im_start|>"] in ids["prompt_ids"]
    assert ids["generated_ids"] == eager_generate(qwen_weights, ids["prompt_ids"], 48)
    # The echo, then each generated token's byte-level piece (HF's ByteLevel decoder: no 'Ġ').
    text = (tmp_path / "outputs.txt").read_bytes()
    assert text == prompt.encode() + b"".join(tokenizer.piece(t) for t in ids["generated_ids"])
    assert "Ġ".encode() not in text[len(prompt.encode()):]
    # No end token was sampled (the model never emits specials): the loop ran to seq_len - 1, and no
    # end-of-sequence newline came before the observer line.
    stats = json.loads(out.splitlines()[-1].split(" ", 1)[1])
    assert stats["prompt_tokens"] + stats["generated_tokens"] == 48 - 1
    assert out.startswith("PyTorchObserver ")


def test_qwen2_5s_end_token_is_the_hf_files_endoftext(qwen_bundle, tokenizer):
    """runner.cpp Runner::load: the tokenizer's EOS and no family marker for qwen2_5; HFTokenizer takes
    the file's one "end" special for it."""
    runner = make_runner(qwen_bundle, "kv", "SmartMask", "qwen2_5")
    assert runner.template.eos_ids == {tokenizer.special_tokens["<|endoftext|>"]}


@pytest.mark.parametrize("n", [1, 7, 8, 9, 17, 100])
def test_prompts_fitted_for_the_bundle_are_the_token_count_the_runner_feeds(qwen_bundle, bundle, n):
    prompt = fit_prompt(bundle, n)
    assert count_tokens(bundle, prompt) == n
    runner = make_runner(qwen_bundle, "hybrid", "SmartMask", "qwen2_5")
    assert len(runner.template.encode_turn(prompt, "", first=True)) == n


def test_every_suite_case_resolves_for_the_bundle(bundle):
    """The suites' own cases, chunk+1 and max-8 included, give prompts (no bad-input error)."""
    points = case_points(load_cases(SUITES_CASES), bundle)
    assert {p.case.name for p in points} >= {"chunk_plus_1", "long", "hostile", "multibyte"}
    for point in points:
        prompt = point.prompt(bundle)
        if point.case.prompt_tokens is not None:
            n = resolve_tokens(point.case.prompt_tokens, bundle, point.mode, point.seq_len)
            assert count_tokens(bundle, prompt) == n
    chunk_plus_1 = next(p for p in points if p.case.name == "chunk_plus_1")
    assert count_tokens(bundle, chunk_plus_1.prompt(bundle)) == bundle.modes["hybrid"].ar_len + 1


def test_a_prompt_too_long_for_the_bundle_is_bad_input_naming_the_case(bundle):
    long = fit_prompt(bundle, 125)
    with pytest.raises(UsageError, match=r"^case 'x': the prompt is 125 tokens .* mode 'hybrid' at seq_len "
                                         r"128 takes at most 120$"):
        check_prompt_fits(bundle, long, "hybrid", 128, what="case 'x'")
