"""The reference bundles write UTF-8 text (LlamaConfig.partial_pieces): upstream's evaluators read
outputs.txt as UTF-8 (device_evaluator.py post_process_model_output, open(..., "r")), and an untrained
byte-level model otherwise writes lone bytes 0x80-0xFF within a few dozen tokens."""

from __future__ import annotations

import json

import pytest

from farm.model.tokenizer import load_tokenizer
from tests.support.runner import make_runner

PROMPTS = ["Once upon a time", "What is the capital of France?", "héllo wörld ✓ 日本", "$(reboot) `id` '\""]


@pytest.mark.parametrize("mode", ["kv", "hybrid"])
def test_every_generation_to_the_end_of_the_context_is_utf8(tiny_bundle, mode):
    runner = make_runner(tiny_bundle, mode, "SmartMask", "llama3")
    for prompt in PROMPTS:
        text = runner.complete(prompt, 128).text
        text.decode("utf-8")  # raises on a partial character
        assert len(text) > 100


def test_the_pieces_kept_out_are_exactly_the_non_utf8_ones(tiny_bundle):
    """Not a vacuous rule: the byte-level tokenizer has such pieces (every lone byte 0x80-0xFF), and
    only those are kept out of what the model writes."""
    manifest = json.loads(tiny_bundle.read_text())
    model = manifest["model"]
    tok = load_tokenizer(tiny_bundle.parent / manifest["tokenizer"])
    partial = set(model["partial_pieces"])
    assert len(partial) >= 128
    for i in range(model["n_base_tokens"]):
        try:
            tok.piece(i).decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        assert valid == (i not in partial), i
