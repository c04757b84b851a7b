"""The tokenizer formats qnn_llama_runner v1.0.1 loads (extension/llm/runner/llm_runner_helper.cpp
load_tokenizer): an HF tokenizer.json (or a directory holding one), a tiktoken file, a llama2c
tokenizer.bin; told apart by content, each encoding and decoding as upstream's tokenizer does, and a
file that is none of them refused with a message naming it."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from farm.errors import UsageError
from farm.model.template import PromptTemplate
from farm.model.tokenizer import (
    CORPUS,
    load_tokenizer,
    train_ranks,
    write_hf_tokenizer,
    write_tiktoken_model,
)

TEXT = "Once upon a time, Über café 日本語のテキスト 🚀 ok\n  two  spaces"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """One small tokenizer file per format, made with the libraries that make them upstream."""
    d = tmp_path_factory.mktemp("tokenizers")
    write_tiktoken_model(d / "tokenizer.model", train_ranks())
    write_hf_tokenizer(d / "tokenizer.json")
    # llama2c: a SentencePiece BPE with byte fallback, converted by pytorch_tokenizers' own exporter
    # (the format stories110m's tokenizer.bin has).
    import sentencepiece as spm
    from pytorch_tokenizers.llama2c import Llama2cTokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS.splitlines()), model_writer=model,
                                   vocab_size=400, model_type="bpe", byte_fallback=True,
                                   num_threads=1, minloglevel=2, character_coverage=1.0)
    (d / "sp.model").write_bytes(model.getvalue())
    Llama2cTokenizer(str(d / "sp.model")).export(str(d / "tokenizer.bin"))
    return {"tiktoken": d / "tokenizer.model", "hf": d / "tokenizer.json", "llama2c": d / "tokenizer.bin"}


def decoded(tok, ids: list[int]) -> bytes:
    """The pieces upstream writes for ``ids``, each decoded after its predecessor."""
    return b"".join(tok.piece(t, prev) for prev, t in zip([None, *ids], ids))


def text_of(tok, ids: list[int]) -> bytes:
    """The text of an encoded prompt: its pieces after the BOS, if it has one."""
    if ids and ids[0] == tok.bos_id:
        return decoded(tok, ids)[len(tok.piece(ids[0])):]
    return decoded(tok, ids)


@pytest.mark.parametrize("fmt", ["tiktoken", "hf", "llama2c"])
def test_each_format_is_recognised_by_its_content_and_round_trips(files, fmt, tmp_path):
    # Renamed to a neutral name: the format is found from the content, as upstream's loaders do.
    neutral = tmp_path / "tok"
    neutral.write_bytes(files[fmt].read_bytes())
    tok = load_tokenizer(neutral)
    assert tok.format == fmt
    assert text_of(tok, tok.encode(TEXT, bos=True)) == TEXT.encode()


def test_the_bos_is_a_token_of_the_first_turn_where_the_format_adds_one(files):
    tiktoken, llama2c = load_tokenizer(files["tiktoken"]), load_tokenizer(files["llama2c"])
    for tok in (tiktoken, llama2c):
        assert tok.encode("Once", bos=True)[0] == tok.bos_id
        assert tok.encode("Once", bos=True)[1:] == tok.encode("Once", bos=False)
    # llama2c_tokenizer.cpp decode: after the BOS the piece's leading space is dropped.
    ids = llama2c.encode("Once upon", bos=True)
    assert decoded(llama2c, ids) == b"<s>Once upon"
    assert llama2c.piece(ids[1]).startswith(b" ")
    # pytorch_tokenizers' HFTokenizer puts no BOS of its own (a tokenizer.json without a template
    # post-processor): qwen2_5 prompts start with their text.
    hf = load_tokenizer(files["hf"])
    assert hf.encode("Once", bos=True) == hf.encode("Once", bos=False)


def test_special_tokens_written_in_text_are_matched_where_the_format_has_them(files):
    tiktoken, hf, llama2c = (load_tokenizer(files[f]) for f in ("tiktoken", "hf", "llama2c"))
    assert tiktoken.encode("a<|eot_id|>b", bos=False).count(tiktoken.special_tokens["<|eot_id|>"]) == 1
    im_start = hf.special_tokens["<|im_start|>"]
    assert hf.encode("a<|im_start|>b", bos=False).count(im_start) == 1
    assert hf.piece(im_start) == b"<|im_start|>"
    # llama2c knows no special token: the marker is text, and decodes back to it.
    ids = llama2c.encode("a<|eot_id|>b", bos=True)
    assert llama2c.special_tokens == {} and text_of(llama2c, ids) == b"a<|eot_id|>b"


def test_end_tokens_per_family_are_upstreams(files):
    """runner.cpp Runner::load (v1.0.1): the tokenizer's EOS, plus the family's end-of-turn marker's
    first id."""
    tiktoken, hf, llama2c = (load_tokenizer(files[f]) for f in ("tiktoken", "hf", "llama2c"))
    specials = tiktoken.special_tokens
    assert PromptTemplate(tiktoken, "llama3").eos_ids == {specials["<|end_of_text|>"],
                                                          specials["<|eot_id|>"]}
    # HFTokenizer, with no tokenizer_config.json beside a file: the one "end" special is the EOS.
    assert PromptTemplate(hf, "qwen2_5").eos_ids == {hf.special_tokens["<|endoftext|>"]}
    assert hf.eos_id == hf.special_tokens["<|endoftext|>"]
    # llama2c: its header's EOS (</s>); a marker it lacks adds the id its text starts with.
    assert PromptTemplate(llama2c, "llama2").eos_ids == {2} == {llama2c.eos_id}
    assert PromptTemplate(llama2c, "phi_4_mini").eos_ids == {2, llama2c.encode("<|end|>", bos=False)[0]}


def test_an_hf_directory_reads_its_tokenizer_config_for_bos_and_eos(files, tmp_path):
    """HFTokenizer::load of a directory: tokenizer.json, and tokenizer_config.json's bos/eos tokens."""
    (tmp_path / "tokenizer.json").write_bytes(files["hf"].read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_start|>"}))
    tok = load_tokenizer(tmp_path)
    assert tok.format == "hf" and tok.eos_id == tok.bos_id == tok.special_tokens["<|im_start|>"]


def _llama2c_header(n: int) -> bytes:
    return struct.pack("<4i", n, 1, 2, 16)


@pytest.mark.parametrize("content,says", [
    (None, "is a directory, not a tokenizer file (a tokenizer directory holds tokenizer.json)"),
    (b"", "is empty, not a tokenizer"),
    (b"\x7fELF\x02\x01\x01" + bytes(200), "is not a tokenizer of any format the runner reads (an HF "
     "tokenizer.json, a tiktoken tokenizer.model or a llama2c tokenizer.bin)"),
    (b'{"model": {"type": "BPE", "vocab": ', "starts as JSON but is not valid JSON"),
    (b'{"name": "config"}', "is JSON but not an HF tokenizer.json (no 'model' object)"),
    (b'{"model": {"type": "WordPiece"}}', "model type 'WordPiece'; upstream's HFTokenizer reads BPE only"),
    (_llama2c_header(4) + struct.pack("<fi", 0, 3) + b"unk",
     "is a damaged llama2c tokenizer.bin: 4 tokens, fewer than the 259 its encoder needs"),
    (_llama2c_header(300) + struct.pack("<fi", 0, 3) + b"unk" + struct.pack("<fi", 0, 3),
     "is a damaged llama2c tokenizer.bin: it ends inside token 1 of 300"),
    (_llama2c_header(300) + b"".join(struct.pack("<fi", 0, 3) + b"abc" for _ in range(5)),
     "is a damaged llama2c tokenizer.bin: token 3 is b'abc', not the byte piece <0x00>"),
])
def test_a_file_that_is_no_tokenizer_is_refused_naming_it_and_what_it_is(tmp_path, content, says):
    path = tmp_path / "tokenizer.bin"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(UsageError) as e:
        load_tokenizer(path, what="bundle 'b': tokenizer")
    assert str(e.value).startswith(f"bundle 'b': tokenizer: {path} ")
    assert says in str(e.value)


def test_a_missing_tokenizer_is_named(tmp_path):
    with pytest.raises(UsageError, match=f"^--tokenizer_path: {tmp_path}/gone does not exist$"):
        load_tokenizer(tmp_path / "gone")


def test_loading_writes_none_of_the_tokenizer_librarys_log_lines(files):
    """pytorch_tokenizers' C++ code writes 'I tokenizers:regex.cpp:40] ...' to fd 2 when imported and
    when an HF file loads; a runner's stderr is what failure messages quote, so none of it gets there."""
    code = ("import sys; from farm.model.tokenizer import load_tokenizer\n"
            "for p in sys.argv[1:]: load_tokenizer(p).encode('Once upon a time', bos=True)\n")
    done = subprocess.run([sys.executable, "-c", code, *map(str, files.values())], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
