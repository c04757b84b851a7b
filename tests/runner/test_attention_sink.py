"""The attention sink of qnn_llama_runner v1.4.1 on the host runner (farm/runner/attention_sink.py) with
the evictors of the tiny v1.4 bundle (farm/bundle/export_sink.py): generation goes past the context
window, kv and hybrid agree there, without the evictor --seq_len is the context, and an eviction done
wrong, or an evictor of another decoder, is caught.

Sources at tag v1.4.1, examples/qualcomm/oss_scripts/llama/: RUN = runner/runner.cpp, TG =
runner/token_generator.cpp, SL = model/static_llama.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from farm.bundle import export_sink
from farm.bundle import manifest as bundle_mod
from farm.errors import UsageError
from farm.runner import io_v14
from farm.runner.engine import LlamaRunner, import_runtime
from farm.runner.io_manager import SmartMaskIoMgr
from farm.runner.lookahead import LookaheadConfig
from tests.support.bundle_v14 import tiny_v14_bundle  # noqa: F401  (a fixture)

EVAL_MODES = {"kv": 0, "hybrid": 1, "lookahead": 2}
CONTEXT = 128  # tiny's
SEQ_LEN = 3 * CONTEXT
PROMPT = "Once upon a time"


def files(manifest) -> dict[str, str]:
    return {f.name: str(f.path) for f in bundle_mod.load(manifest).files}


def evictor_of(manifest, mode: str) -> str:
    return files(manifest)[bundle_mod.load(manifest).modes[mode].attention_sink_rope]


def runner(manifest, mode: str, sink: str | None = "", io_cls=SmartMaskIoMgr) -> LlamaRunner:
    """A runner of the mode's program; ``sink`` "" is the mode's own evictor, None none."""
    b = bundle_mod.load(manifest)
    by_name = files(manifest)
    path = evictor_of(manifest, mode) if sink == "" else (sink or "")
    return LlamaRunner(by_name[b.modes[mode].pte], by_name[b.tokenizer], EVAL_MODES[mode], io_cls,
                       "llama3", lookahead=LookaheadConfig(3, 4, 4), upstream="v1.4.1",
                       kv_method="kv_forward", attention_sink_rope_path=path)


@pytest.fixture(scope="module")
def past_context(tiny_v14_bundle):
    """Per mode: (runner, its generation to SEQ_LEN with the sink)."""
    out = {}
    for mode in EVAL_MODES:
        r = runner(tiny_v14_bundle, mode)
        out[mode] = (r, r.complete(PROMPT, SEQ_LEN))
    return out


def test_the_bundle_has_an_evictor_per_decode_width(tiny_v14_bundle):
    b = bundle_mod.load(tiny_v14_bundle, verify=True)
    assert {k: m.attention_sink_rope for k, m in b.modes.items()} == export_sink.MODE_EVICTORS
    assert {f.name: f.role for f in b.files if f.name.endswith("evictor.pte")} == {
        export_sink.EVICTOR_PTE: "other", export_sink.LOOKAHEAD_EVICTOR_PTE: "other"}
    assert b.modes["hybrid"].attention_sink_args == ["--attention_sink_rope_path", export_sink.EVICTOR_PTE]
    runtime = import_runtime().Runtime.get()
    for pte, methods in export_sink.evictor_methods(16, 16).items():
        program = runtime.load_program(files(tiny_v14_bundle)[pte])
        # ASW:424-426 the decoder's method names; SL:262-267 the constants.
        assert set(program.method_names) == {*methods, "get_eviction_batch_size", "get_max_context_len",
                                             "get_sink_size"}
        consts = {n: int(program.load_method(n).execute([])[0])
                  for n in ("get_eviction_batch_size", "get_max_context_len", "get_sink_size")}
        assert consts == {"get_eviction_batch_size": 32, "get_max_context_len": CONTEXT, "get_sink_size": 4}


def test_the_evictor_is_the_wheels_attention_sink_rope(tiny_v14_bundle):
    """The lowered program computes what SL's AttentionSinkRope computes: the sink kept, the entries
    after the evicted batch re-rotated and moved down, zeros at the end."""
    b = bundle_mod.load(tiny_v14_bundle)
    cfg = export_sink.LlamaConfig(**{k: v if not isinstance(v, list) else tuple(v)
                                     for k, v in b.model.items()
                                     if k in export_sink.LlamaConfig.__dataclass_fields__})
    method = import_runtime().Runtime.get().load_program(
        files(tiny_v14_bundle)[export_sink.EVICTOR_PTE]).load_method("kv_forward")
    gen = torch.Generator().manual_seed(0)
    k = [torch.randn(1, 2, 16, CONTEXT - 1, generator=gen) for _ in range(2)]
    v = [torch.randn(1, 2, CONTEXT - 1, 16, generator=gen) for _ in range(2)]
    got = method.execute([*k, *v])
    want_k, want_v = export_sink.evictor(cfg, 1)(k, v)
    for a, b_ in zip(got, [*want_k, *want_v], strict=True):
        torch.testing.assert_close(a, b_)
    keep = CONTEXT - 4 - 32 - 1
    torch.testing.assert_close(got[2][..., :4, :], v[0][..., :4, :])  # the sink
    torch.testing.assert_close(got[2][..., 4 : 4 + keep, :], v[0][..., 36 : 36 + keep, :])  # moved
    assert not got[2][..., 4 + keep :, :].any()  # room for the next batch


@pytest.mark.parametrize("mode", EVAL_MODES)
def test_generation_goes_past_the_context(past_context, tiny_v14_bundle, mode):
    r, g = past_context[mode]
    # TG:274: until pos = seq_len - 1; written: prefill's token, then one per step. Lookahead may
    # accept past it in its last step.
    n = SEQ_LEN - len(g.prompt_ids)
    assert (len(g.generated_ids) >= n) if mode == "lookahead" else (len(g.generated_ids) == n)
    assert not g.reached_eos
    assert r.sink.evictions >= 7 and r.sink.position_shift == 32 * r.sink.evictions
    assert r.cur_pos - r.sink.position_shift == r.io.n_past <= r.io.cache_len
    # Until the first eviction the run is the one without the evictor (TG:278-280: none is due yet).
    plain = runner(tiny_v14_bundle, mode, sink=None).complete(PROMPT, SEQ_LEN).generated_ids
    assert len(plain) < len(g.generated_ids)
    before = 80  # tokens generated before lookahead's first eviction (at 110 cached of 112)
    assert g.generated_ids[:before] == plain[:before]


def test_kv_and_hybrid_agree_past_the_context(past_context):
    """Both decode with kv_forward and evict with the evictor's kv_forward at the same positions; the
    prompt (one hybrid chunk) never needs one."""
    assert past_context["kv"][1].generated_ids == past_context["hybrid"][1].generated_ids


def test_without_the_sink_seq_len_is_the_context(tiny_v14_bundle):
    """RUN:393-401: a --seq_len past the context is clamped to it when there is no evictor."""
    for mode in ("kv", "hybrid"):
        r = runner(tiny_v14_bundle, mode, sink=None)
        g = r.complete(PROMPT, SEQ_LEN)
        assert r.sink is None and r.cur_pos == CONTEXT - 1
        assert len(g.generated_ids) == CONTEXT - len(g.prompt_ids)


def test_turns_continue_past_the_context(tiny_v14_bundle):
    """A second prompt after a generation past the context: hybrid's prefill rearranges the full decode
    cache into its own (KVM:284-294) and evicts before its first chunk (PP:314-332)."""
    r = runner(tiny_v14_bundle, "hybrid")
    first = r.complete(PROMPT, 300)
    evictions = r.sink.evictions
    second = r.generate(r.template.format("The end", ""), 500, 0.0, torch.Generator())
    assert r.cur_pos == 499 and r.sink.evictions > evictions
    assert len(second.generated_ids) == 500 - 300 - len(second.prompt_ids) + 1
    assert first.generated_ids != second.generated_ids


class ShiftsOneLess(io_v14.SmartMaskV14):
    """An eviction that moves shifted_pos back one entry short of the batch (TG:282-283 off by one)."""

    def evicted(self, n):
        super().evicted(n - 1)


class KeepsTheCaches(io_v14.SmartMaskV14):
    """An evictor whose outputs never reach the cache buffers (no set_outputs, ASR:20-29): positions
    and mask move, the entries are neither moved nor re-rotated."""

    def caches(self):
        return [c.clone() for c in super().caches()]


@pytest.mark.parametrize("variant", [ShiftsOneLess, KeepsTheCaches])
@pytest.mark.parametrize("mode", ["kv", "hybrid"])
def test_a_broken_eviction_changes_the_tokens(past_context, tiny_v14_bundle, mode, variant):
    broken = runner(tiny_v14_bundle, mode, io_cls=variant).complete(PROMPT, SEQ_LEN).generated_ids
    good = past_context[mode][1].generated_ids
    assert broken != good
    first = next(i for i, (a, b) in enumerate(zip(broken, good)) if a != b)
    assert first > 80  # the same until the first eviction


def test_an_evictor_of_another_decoder_is_refused(tiny_v14_bundle, tmp_path):
    by_name = files(tiny_v14_bundle)
    lookahead_evictor = by_name[export_sink.LOOKAHEAD_EVICTOR_PTE]
    # hybrid's kv_forward caches are 127 wide, the lookahead evictor's kv_forward takes 112.
    with pytest.raises(UsageError, match=rf"--attention_sink_rope_path: {lookahead_evictor}: method "
                                         r"'kv_forward' takes 4 tensors \[\(1, 2, 16, 112\)\]"):
        runner(tiny_v14_bundle, "hybrid", sink=lookahead_evictor)
    # A decoder given as the evictor: kv mode finds kv_forward but no eviction batch size; hybrid
    # needs a prefill_forward the kv program lacks.
    kv_pte = by_name["kv_llama_qnn.pte"]
    with pytest.raises(UsageError, match=rf"{kv_pte} lacks metadata method 'get_eviction_batch_size'"):
        runner(tiny_v14_bundle, "kv", sink=kv_pte)
    with pytest.raises(UsageError, match=rf"{kv_pte} has no method 'prefill_forward'"):
        runner(tiny_v14_bundle, "hybrid", sink=kv_pte)
    with pytest.raises(UsageError, match="--attention_sink_rope_path: .*missing.pte does not exist"):
        runner(tiny_v14_bundle, "kv", sink=str(tmp_path / "missing.pte"))


def test_the_cli_shown_as_1_4_1_runs_past_the_context(tiny_v14_bundle, tmp_path, monkeypatch, capsys):
    from farm.runner import main as runner_main

    monkeypatch.chdir(tmp_path)
    by_name, b = files(tiny_v14_bundle), bundle_mod.load(tiny_v14_bundle)
    with pytest.raises(SystemExit) as exc:
        runner_main.main(["--ptefarm_upstream=v1.4.1", "--model_path", by_name[b.modes["hybrid"].pte],
                          "--tokenizer_path", by_name[b.tokenizer], "--eval_mode", "1",
                          "--decoder_model_version", "llama3", "--prompt", PROMPT, "--seq_len", "300",
                          "--attention_sink_rope_path", evictor_of(tiny_v14_bundle, "hybrid")])
    out, err = capsys.readouterr()
    assert exc.value.code == 0, err
    stats = json.loads(out.splitlines()[-1].split(" ", 1)[1])
    assert stats["generated_tokens"] == 300 - 1 - stats["prompt_tokens"]
    assert (tmp_path / "outputs.txt").is_file()
