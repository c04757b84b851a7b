"""SmartMask and ShiftPointer give identical tokens at temperature 0, and equal the eager reference.

The comparison is proved able to fail: broken updaters and a corrupted cache entry are caught by it.
"""

from __future__ import annotations

import pytest
import torch

from farm.execute.compare import Comparison
from farm.execute.run import RunResult
from farm.model.llama import eager_generate
from farm.runner.engine import LlamaRunner
from farm.runner.io_manager import ShiftPointerIoMgr, SmartMaskIoMgr
from tests.support.runner import greedy, make_runner, paths, prompt_of_length

PREFILL = 16  # tiny's prefill ar_len
CONTEXT = 128  # tiny's max_seq_len
MODES = ["kv", "hybrid"]
# prompt lengths: 1, exactly one prefill chunk, one chunk + 1, several chunks with a short last one
PROMPT_LENGTHS = [1, PREFILL, PREFILL + 1, 2 * PREFILL + 5]


@pytest.fixture(scope="module")
def runners(tiny_bundle):
    return {(mode, upd): make_runner(tiny_bundle, mode, upd)
            for mode in MODES for upd in ("SmartMask", "ShiftPointer")}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n_prompt", PROMPT_LENGTHS)
def test_updaters_agree_and_match_eager(runners, tiny_weights, mode, n_prompt):
    seq_len = n_prompt + 24
    prompt = prompt_of_length(runners[(mode, "SmartMask")], n_prompt)
    ids_sm, gen_sm = greedy(runners[(mode, "SmartMask")], prompt, seq_len)
    ids_sp, gen_sp = greedy(runners[(mode, "ShiftPointer")], prompt, seq_len)
    assert len(ids_sm) == n_prompt
    assert len(gen_sm) == seq_len - n_prompt
    assert gen_sm == gen_sp
    assert gen_sm == eager_generate(tiny_weights, ids_sm, seq_len)


@pytest.mark.parametrize("mode", MODES)
def test_generation_to_the_end_of_the_context(runners, tiny_weights, mode):
    prompt = prompt_of_length(runners[(mode, "SmartMask")], PREFILL + 1)
    ids, gen_sm = greedy(runners[(mode, "SmartMask")], prompt, CONTEXT)
    _, gen_sp = greedy(runners[(mode, "ShiftPointer")], prompt, CONTEXT)
    assert len(ids) + len(gen_sm) == CONTEXT
    assert gen_sm == gen_sp
    assert gen_sm == eager_generate(tiny_weights, ids, CONTEXT)


def test_cache_holds_the_same_entries_in_both_layouts(runners):
    """Same (K, V) pairs, different places: SmartMask left-aligned, ShiftPointer right-aligned."""
    prompt = prompt_of_length(runners[("hybrid", "SmartMask")], 2 * PREFILL + 3)
    for upd in ("SmartMask", "ShiftPointer"):
        greedy(runners[("hybrid", upd)], prompt, 60)
    sm, sp = runners[("hybrid", "SmartMask")].io, runners[("hybrid", "ShiftPointer")].io
    assert sm.n_past == sp.n_past == 59
    for head in range(sm.shape.n_caches):
        torch.testing.assert_close(sm.cached_k(head), sp.cached_k(head), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sm.cached_v(head), sp.cached_v(head), rtol=1e-5, atol=1e-5)
    # Right-aligned: ShiftPointer's newest entry sits in the last cache column, SmartMask's at n_past-1.
    torch.testing.assert_close(sp.k_inputs()[0][0, :, -1], sm.k_inputs()[0][0, :, sm.n_past - 1])


def test_shift_pointer_k_input_is_a_zero_copy_window(runners):
    r = runners[("kv", "ShiftPointer")]
    greedy(r, prompt_of_length(r, 5), 20)
    io = r.io
    k = io.k_inputs()[0]
    assert k.is_contiguous()
    assert k.data_ptr() == io.k_buf[0].data_ptr() + io.n_past * k.element_size()
    assert io.k_buf[0].numel() == (io.shape.head_dim + 1) * (io.shape.max_seq_len - 1)


# --- the comparison can fail: deliberately broken updaters are caught --------------------------------

class OneSlotOffSmartMask(SmartMaskIoMgr):
    """Writes each new entry one slot too far (and unmasks the right columns)."""

    def _store(self, new_k, new_v, n):
        pos = self.n_past + 1
        for k_in, v_in, k, v in zip(self.k_inputs(), self.v_inputs(), new_k, new_v):
            end = min(pos + n, self.cache_len)
            k_in[0, :, pos:end] = k[0, :, : end - pos]
            v_in[0, pos:end] = v[0, : end - pos]


class ForgetsToUnmaskSmartMask(SmartMaskIoMgr):
    """Stores the entries but never opens their mask columns: attention sees only the current token."""

    def update(self, outputs, n):
        saved = self.mask.clone()
        super().update(outputs, n)
        self.mask.copy_(saved)


class OneSlotOffShiftPointer(ShiftPointerIoMgr):
    """Writes new K one column short of the row's end."""

    def _store(self, new_k, new_v, n):
        cl, hd, p = self.cache_len, self.shape.head_dim, self.n_past
        for kb, vb, k, v in zip(self.k_buf, self.v_buf, new_k, new_v):
            kb.as_strided((hd, n), (cl, 1), kb.storage_offset() + p + cl - 1).copy_(k[0, :, :n])
            vb[(p + cl) * hd : (p + cl + n) * hd] = v[0, :n].reshape(-1)


class CorruptsOneEntry(SmartMaskIoMgr):
    """A correct updater whose cache gets one K entry corrupted after the prompt is in."""

    corrupt_at = 8

    def update(self, outputs, n):
        super().update(outputs, n)
        if self.n_past - n < self.corrupt_at <= self.n_past:
            self.k_inputs()[0][0, 0, 3] += 5.0


@pytest.mark.parametrize("broken", [OneSlotOffSmartMask, ForgetsToUnmaskSmartMask,
                                    OneSlotOffShiftPointer, CorruptsOneEntry])
@pytest.mark.parametrize("mode", MODES)
def test_broken_updater_is_caught(tiny_bundle, runners, mode, broken):
    good = runners[(mode, "SmartMask")]
    prompt = prompt_of_length(good, PREFILL + 1)
    _, expected = greedy(good, prompt, 60)
    _, got = greedy(make_runner(tiny_bundle, mode, broken), prompt, 60)
    assert got != expected


def test_next_token_depends_on_the_cached_context(tiny_weights):
    """Same last token, different earlier context: the next token changes (the cache matters)."""
    from farm.model.llama import eager_logits

    gen = torch.Generator().manual_seed(7)
    last = 300
    nexts = set()
    for _ in range(12):
        ctx = torch.randint(0, 500, (10,), generator=gen).tolist()
        nexts.add(int(eager_logits(tiny_weights, ctx + [last])[-1].argmax()))
    assert len(nexts) >= 4


def test_temperature_sampling_is_seeded(runners):
    r = runners[("kv", "SmartMask")]
    prompt = prompt_of_length(r, 4)
    a = r.complete(prompt, 40, 0.9, seed=1).generated_ids
    b = r.complete(prompt, 40, 0.9, seed=1).generated_ids
    c = r.complete(prompt, 40, 0.9, seed=2).generated_ids
    assert a == b
    assert a != c


# --- logits: a divergence seen before it flips a token ----------------------------------------------

class NudgesOneEntry(SmartMaskIoMgr):
    """A cache entry a little off after the prompt (3e-3 on one K value): every greedy token still
    agrees on the reference prompt, only the logits show it."""

    def update(self, outputs, n):
        super().update(outputs, n)
        if self.n_past - n < 8 <= self.n_past:
            self.k_inputs()[0][0, 0, 3] += 3e-3


def _run_result(runner, updater: str, prompt: str) -> RunResult:
    gen = runner.complete(prompt, 100)
    return RunResult(serial="host", bundle="tiny", mode="kv", updater=updater, command="",
                     exit_code=0, stdout="", stderr="", duration_s=0.0,
                     observers=[gen.stats.to_json()], generated_ids=gen.generated_ids,
                     logits=runner.logits_dump(), logits_dtype="float32")


def test_the_logits_comparison_catches_an_updater_whose_tokens_still_agree(tiny_bundle):
    pte, tok = paths(tiny_bundle, "kv")
    prompt = "Once upon a time"

    def result(io_mgr, updater):
        return _run_result(LlamaRunner(pte, tok, 0, io_mgr, "llama3", dump_logits=True), updater, prompt)

    good = Comparison(serial="host", mode="kv", prompt=prompt, seq_len=100, results={
        "SmartMask": result(SmartMaskIoMgr, "SmartMask"),
        "ShiftPointer": result(ShiftPointerIoMgr, "ShiftPointer")})
    assert good.agree, good.explain()
    assert good.logits.rows_compared > 90 and good.logits.max_ulp <= good.logits_tolerance_ulp

    nudged = Comparison(serial="host", mode="kv", prompt=prompt, seq_len=100, results={
        "SmartMask": good.results["SmartMask"], "ShiftPointer": result(NudgesOneEntry, "ShiftPointer")})
    assert nudged.tokens_agree  # the tokens alone would pass it
    assert not nudged.agree and "their logits differ from prompt token" in nudged.explain()
