"""The third reference bundle (farm export --model tiny-stories): llama2, the family of upstream's
stories110m/stories260k, with their tokenizer pair: a SentencePiece BPE tokenizer.model (what llama.py
reads on the host) and the llama2c tokenizer.bin exported from it by pytorch_tokenizers'
Llama2cTokenizer.export (what qnn_llama_runner reads). farm-llama-runner runs it as upstream's runner
runs a llama2 bundle; prompt fitting and every suite case work for it (the issue: an empty llama2
prompt, which llama2c's encoder refuses, made every `prompt_tokens` case fail)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.bundle.export import SENTENCEPIECE_MODEL
from farm.bundle.tokens import count_tokens, fit_prompt
from farm.model.config import LLAMA2C_SPECIALS
from farm.model.llama import eager_generate
from farm.model.tokenizer import SENTENCEPIECE_VOCAB, load_tokenizer, write_sentencepiece_tokenizer
from farm.runner import main as runner_main
from ptefarm_suites.cases import case_points, load_cases, resolve_tokens
from tests.support.runner import paths

SUITES_CASES = Path(__file__).resolve().parents[2] / "suites" / "data" / "correctness.toml"
TEXT = "Once upon a time, Über 日本 🚀 ok"


@pytest.fixture(scope="module")
def bundle(stories_bundle):
    return bundle_mod.load(stories_bundle)


@pytest.fixture(scope="module")
def tokenizer(bundle):
    return load_tokenizer({f.name: f.path for f in bundle.files}[bundle.tokenizer])


def test_the_pair_is_sentencepiece_and_the_llama2c_bin_upstream_exports_from_it(stories_bundle, bundle,
                                                                                 tokenizer, tmp_path):
    from pytorch_tokenizers.llama2c import Llama2cTokenizer

    assert bundle.decoder_model_version == "llama2" and bundle.tokenizer == "tokenizer.bin"
    assert tokenizer.format == "llama2c" and tokenizer.n_words == SENTENCEPIECE_VOCAB
    assert (tokenizer.bos_id, tokenizer.eos_id) == (1, 2)
    sp = Llama2cTokenizer(str(stories_bundle.parent / SENTENCEPIECE_MODEL))
    # The runner's encoder (llama2c's, by the pieces' scores) and the host's (SentencePiece) agree on
    # text, byte fallback included, so the host's --tokenized_prompt and the device's prompt are one.
    assert tokenizer.encode(TEXT, bos=True) == sp.encode(TEXT, bos=True, eos=False)
    ids = tokenizer.encode(TEXT, bos=True)
    assert ids[0] == tokenizer.bos_id and tokenizer.decode(ids[1:]) == " " + TEXT  # SentencePiece's dummy prefix
    # The same files on every machine: trained again, byte for byte.
    write_sentencepiece_tokenizer(tmp_path / "m", tmp_path / "b")
    assert (tmp_path / "m").read_bytes() == (stories_bundle.parent / SENTENCEPIECE_MODEL).read_bytes()
    assert (tmp_path / "b").read_bytes() == (stories_bundle.parent / "tokenizer.bin").read_bytes()


def test_the_model_never_writes_the_vocabularys_specials(bundle):
    assert set(LLAMA2C_SPECIALS) <= set(bundle.model["partial_pieces"])


@pytest.mark.parametrize("mode", ["kv", "hybrid"])
def test_farm_llama_runner_generates_what_the_eager_model_does(stories_bundle, stories_weights, tokenizer,
                                                               mode, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    pte, tok = paths(stories_bundle, mode)
    with pytest.raises(SystemExit) as exc:
        runner_main.main([str(a) for a in ["--model_path", pte, "--tokenizer_path", tok, "--eval_mode",
                                           0 if mode == "kv" else 1, "--decoder_model_version", "llama2",
                                           "--prompt", TEXT, "--seq_len", 48, "--token_ids_path", "ids.json"]])
    assert exc.value.code == 0, capsys.readouterr().err
    ids = json.loads((tmp_path / "ids.json").read_text())
    assert ids["prompt_ids"] == tokenizer.encode(TEXT, bos=True)  # llama2: the prompt as it is, BOS first
    assert ids["generated_ids"] == eager_generate(stories_weights, ids["prompt_ids"], 48)
    text = (tmp_path / "outputs.txt").read_bytes()
    assert text.startswith(TEXT.encode()) and len(ids["generated_ids"]) == 48 - len(ids["prompt_ids"])


@pytest.mark.parametrize("n", [1, 2, 11, 12, 13, 100])
def test_prompts_fitted_for_the_bundle_are_the_token_count_the_runner_feeds(bundle, n):
    assert count_tokens(bundle, "") == 1  # the BOS alone: llama2c's encoder refuses empty text
    assert count_tokens(bundle, fit_prompt(bundle, n)) == n


def test_every_suite_case_resolves_for_the_bundle(bundle):
    points = case_points(load_cases(SUITES_CASES), bundle)
    assert {p.case.name for p in points} >= {"chunk_plus_1", "long", "hostile", "multibyte"}
    for point in points:
        if point.case.prompt_tokens is not None:
            n = resolve_tokens(point.case.prompt_tokens, bundle, point.mode, point.seq_len)
            assert count_tokens(bundle, point.prompt(bundle)) == n
