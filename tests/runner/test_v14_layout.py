"""The host runner on programs of ExecuTorch 1.4.1's layout (farm/runner/io_v14.py) gives the tokens it
gives on the v1.0.1 program of the same model: both hold the same checkpoint, so at temperature 0 they
must agree, in kv, hybrid and lookahead mode, across prefill chunk edges and turns. A SmartMask that
writes or unmasks one column off is caught by the same comparison.

Sources at tag v1.4.1, examples/qualcomm/oss_scripts/llama/runner/: RUN = runner.cpp, KVM = kv_manager.cpp.
"""

from __future__ import annotations

import numpy as np
import pytest

from farm.errors import UsageError
from farm.runner import io_v14
from farm.runner.engine import LlamaRunner
from farm.runner.io_manager import ContextFull, ShiftPointerIoMgr, SmartMaskIoMgr
from farm.runner.logits import HOST_DTYPE, diff_logits, read_logits_dump
from farm.runner.lookahead import LookaheadConfig
from tests.support.bundle_v14 import tiny_v14_bundle  # noqa: F401  (a fixture)
from tests.support.runner import TEXT, paths

EVAL_MODES = {"kv": 0, "hybrid": 1, "lookahead": 2}
SEQ_LEN = 110  # room for a variant that writes one column past the entries it was given
# Prompt lengths in characters: the token counts fall on both sides of the prefill's 16-token chunks.
PROMPTS = [TEXT[:end] for end in (1, 9, 30, 47, 62, 95, 160)]


def runner(manifest, mode: str, io_cls=SmartMaskIoMgr, **kw) -> LlamaRunner:
    pte, tok = paths(manifest, mode)
    return LlamaRunner(pte, tok, EVAL_MODES[mode], io_cls, "llama3",
                       lookahead=LookaheadConfig(3, 4, 4), **kw)


def tokens(r: LlamaRunner, prompt: str) -> list[int] | str:
    """The greedy tokens of a fresh conversation, or what stopped it (a broken variant may overflow)."""
    try:
        return r.complete(prompt, SEQ_LEN).generated_ids
    except (ContextFull, UsageError) as e:
        return f"{type(e).__name__}: {e}"


class StoresOneColumnOff(io_v14.SmartMaskV14):
    """KVM update_key/update_value writing at n_past + 1 instead of n_past."""

    def _store(self, new_k, new_v, n):
        self.n_past += 1
        try:
            super()._store(new_k, new_v, n)
        finally:
            self.n_past -= 1


class UnmasksOneColumnOff(io_v14.SmartMaskV14):
    """KVM update_attention_mask opening columns [n_past + 1, n_past + n + 1)."""

    def _attend_columns(self, n_past, n):
        return slice(n_past + 1, n_past + n + 1)


@pytest.fixture(scope="module")
def both(tiny_bundle, tiny_v14_bundle):
    """Per mode, a runner on the v1.0.1 program and one on the 1.4.1-layout program."""
    return {mode: (runner(tiny_bundle, mode), runner(tiny_v14_bundle, mode)) for mode in EVAL_MODES}


@pytest.mark.parametrize("mode", EVAL_MODES)
def test_the_runner_reads_the_layout_from_the_program(tiny_bundle, both, mode):
    v10, v14 = both[mode]
    assert (v10.v14, v14.v14) == (False, True)
    assert isinstance(v14.io, io_v14.SmartMaskV14) and not isinstance(v10.io, io_v14.SmartMaskV14)
    # RUN:221-265: vocab from output 0, heads/head_dim from output 1, AR and CL from the mask,
    # n_layers from get_n_layers; max_cache_len = CL - min(AR).
    assert (v14.shape, v14.vocab_size) == (v10.shape, v10.vocab_size)
    assert (v14.prefill_ar, v14.decode_ar) == (v10.prefill_ar, v10.decode_ar)
    assert v14.io.max_cache_len == 128 - min(v14.prefill_ar, v14.decode_ar)
    # RUN:165-177: kv mode runs kv_forward alone, hybrid and lookahead prefill_forward then kv_forward.
    names = (v14.prefill.metadata.name(), v14.decode.metadata.name())
    assert names == (("kv_forward", "kv_forward") if mode == "kv" else ("prefill_forward", "kv_forward"))


@pytest.mark.parametrize("mode", EVAL_MODES)
def test_both_layouts_give_the_same_tokens(both, mode):
    v10, v14 = both[mode]
    for prompt in PROMPTS:
        expected = tokens(v10, prompt)
        assert isinstance(expected, list) and len(expected) > 20
        assert tokens(v14, prompt) == expected, prompt


@pytest.mark.parametrize("mode", ["kv", "hybrid"])
def test_both_layouts_agree_across_turns(tiny_bundle, tiny_v14_bundle, mode):
    # The position carries over from one generate call to the next (RUN:458, 490): the second turn
    # attends the first's cache, rearranged between methods in hybrid mode (KVM:284-360).
    out = []
    for manifest in (tiny_bundle, tiny_v14_bundle):
        r = runner(manifest, mode)
        first = r.complete(TEXT[:40], 50)
        second = r.generate(r.template.format(TEXT[40:70], ""), 100, 0.0, _gen())
        out.append((first.generated_ids, second.generated_ids))
    assert out[0] == out[1]


def _gen():
    import torch

    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("variant", [StoresOneColumnOff, UnmasksOneColumnOff])
@pytest.mark.parametrize("mode", ["kv", "hybrid"])
def test_a_smart_mask_one_column_off_is_caught(both, tiny_v14_bundle, mode, variant):
    v10, _ = both[mode]
    broken = runner(tiny_v14_bundle, mode, variant)
    assert isinstance(broken.io, variant)
    caught = [p for p in PROMPTS if tokens(broken, p) != tokens(v10, p)]
    assert caught == PROMPTS


def test_a_1_4_1_program_has_smart_mask_only(tiny_v14_bundle):
    with pytest.raises(UsageError, match="SmartMask only"):
        runner(tiny_v14_bundle, "hybrid", ShiftPointerIoMgr)


def test_kv_mode_dumps_the_logits_as_upstream_writes_them(tiny_bundle, tiny_v14_bundle, tmp_path):
    # RUN:66-83, 499-504: every prompt processor row then every token generator row; a 32-bit
    # program's are float32 (device_evaluator.py:85 reads them so when get_kv_io_bit_width is 32).
    dumps = []
    for i, manifest in enumerate((tiny_bundle, tiny_v14_bundle)):
        r = runner(manifest, "kv", dump_logits=True)
        gen = r.complete(TEXT[:60], 90)
        path = tmp_path / f"all_logits_{i}.raw"
        path.write_bytes(r.logits_dump())
        n_rows = gen.stats.prompt_tokens + gen.stats.generated_tokens
        dumps.append(read_logits_dump(path, n_rows=n_rows, dtype=HOST_DTYPE))
    a, b = dumps
    assert a.shape == b.shape and a.shape[1] == 768
    # Another graph of the same weights: a few ulp of summation order apart, the same argmax.
    diff = diff_logits(a, b, tolerance_ulp=8)
    assert diff.identical, diff
    assert (a.argmax(axis=1) == b.argmax(axis=1)).all()
    assert np.isfinite(b).all()


def test_the_cli_dumps_logits_for_a_1_4_1_kv_program(tiny_v14_bundle, tmp_path, monkeypatch, capsys):
    import json

    from farm.runner import main as runner_main

    monkeypatch.chdir(tmp_path)
    pte, tok = paths(tiny_v14_bundle, "kv")
    with pytest.raises(SystemExit) as exc:
        runner_main.main(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0",
                          "--kv_updater", "SmartMask", "--decoder_model_version", "llama3",
                          "--prompt", "Once upon a time", "--seq_len", "40",
                          "--dump_logits_path", "all_logits.raw"])
    out, err = capsys.readouterr()
    assert exc.value.code == 0, err
    stats = json.loads(out.splitlines()[-1].split(" ", 1)[1])
    n_rows = stats["prompt_tokens"] + stats["generated_tokens"]
    rows = read_logits_dump(tmp_path / "all_logits.raw", n_rows=n_rows, dtype=HOST_DTYPE)
    assert rows.shape == (n_rows, 768)
