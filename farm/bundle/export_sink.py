"""The attention-sink evictor of ExecuTorch 1.4.1 for a reference bundle in 1.4.1's layout: a second
program beside the decoder that qnn_llama_runner v1.4.1 runs on the KV caches to make room past the
context window (``--attention_sink_rope_path``).

Sources at tag v1.4.1, examples/qualcomm/oss_scripts/llama/: SL = model/static_llama.py, ASW =
wrappers/attention_sink_wrappers.py, DC = decoder_constants.py.

- The model is the wheel's ``AttentionSinkRope`` (SL:48-267), built as ASW:260-296 builds it, with the
  decoder's ModelArgs (farm/model/upstream_llama.py), ``sink_size`` and ``eviction_batch_size`` (llama.py
  ``--use_attention_sink <sink_size>,<eviction_batch_size>``, ASW:189-205) and the ar_len of the
  decoder method it serves. Its inputs are the decoder method's caches (a k [1, H, D, CL - AR] and a v
  [1, H, CL - AR, D] per layer: k caches first, then v caches), its outputs the same caches after the
  eviction: the first ``sink_size`` entries, then entries [sink + batch, CL - AR) re-rotated by RoPE
  to positions [sink, ...), then ``eviction_batch_size`` zero entries (SL:188-251).
- One method per decoder method, named as the decoder's (ASW:424-426: DECODER_GRAPH_NAMES[:n],
  ``kv_forward`` then ``prefill_forward``); kv mode builds no prefill evictor (ASW:262-263), so an
  evictor built for hybrid serves kv mode too (runner.cpp loads only the decoder's method names).
- Constant methods: AttentionSinkRope.get_metadata() (SL:262-267, ASW:440 ``constant_methods=
  self.decode_evictor.meta``): get_eviction_batch_size (what the runner reads,
  attention_sink_rope_runner.cpp:43-45), get_max_context_len, get_sink_size (what
  is_attention_sink_config_equal compares, ASW:208-230).
- File name: ``{artifact}/attention_sink_evictor.pte`` (llama.py:724, DC ATTENTION_SINK_EVICTOR). A
  bundle holding programs of two decode ar_lens (lookahead's kv_forward is 16 wide) needs a second
  evictor; upstream compiles one per artifact directory (one model mode), so that one is named here
  ``lookahead_attention_sink_evictor.pte``.

Float, lowered to XNNPACK (not quantized and lowered to QNN as ASW:306-357 and 399-456 do): the
reference decoder is float too, so its caches are float.
"""

from __future__ import annotations

from pathlib import Path

from farm.model.config import LlamaConfig

ATTENTION_SINK_EVICTOR = "attention_sink_evictor"  # DC:21
EVICTOR_PTE = f"{ATTENTION_SINK_EVICTOR}.pte"  # llama.py:724
LOOKAHEAD_EVICTOR_PTE = f"lookahead_{ATTENTION_SINK_EVICTOR}.pte"
# The reference's --use_attention_sink: llama.py's help example "4,32" (llama.py:529-533). ASW:270-280
# needs sink + batch <= context and batch >= every ar_len it serves (tiny: 1 and 16; lookahead's
# ngram 3 too, ASW:282-285).
SINK_SIZE = 4
EVICTION_BATCH_SIZE = 32


def check_config(cfg: LlamaConfig, ar_lens: set[int], sink_size: int = SINK_SIZE,
                 eviction_batch_size: int = EVICTION_BATCH_SIZE) -> None:
    """ASW:270-280's assertions, as errors."""
    if sink_size + eviction_batch_size > cfg.max_seq_len:
        raise ValueError(f"sink_size ({sink_size}) + eviction_batch_size ({eviction_batch_size}) must "
                         f"be <= max_context_len ({cfg.max_seq_len})")
    if eviction_batch_size < max(ar_lens):
        raise ValueError(f"eviction_batch_size ({eviction_batch_size}) must be >= ar_len ({max(ar_lens)})")
    if cfg.max_seq_len <= max(ar_lens):
        raise ValueError("the attention sink needs max_context_len > ar_len (not a BERT model)")


def evictor(cfg: LlamaConfig, ar_len: int, sink_size: int = SINK_SIZE,
            eviction_batch_size: int = EVICTION_BATCH_SIZE):
    """The wheel's AttentionSinkRope for the decoder method of ``ar_len`` (ASW:287-293)."""
    from farm.model import upstream_llama

    sl = upstream_llama.static_llama()
    check_config(cfg, {ar_len}, sink_size, eviction_batch_size)
    return sl.AttentionSinkRope(upstream_llama.model_args(cfg), sink_size, eviction_batch_size,
                                ar_len).eval()


def write_evictor(cfg: LlamaConfig, methods: dict[str, int], path: Path, *,
                  sink_size: int = SINK_SIZE, eviction_batch_size: int = EVICTION_BATCH_SIZE) -> None:
    """One evictor .pte: a method per decoder method (name -> that method's ar_len), XNNPACK-lowered
    in one call as ASW:429-441 lowers [decode, prefill], with the evictor's metadata."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    models = {name: evictor(cfg, ar, sink_size, eviction_batch_size) for name, ar in methods.items()}
    with torch.no_grad():
        exported = {name: torch.export.export(m, m.get_example_inputs(), strict=False)
                    for name, m in models.items()}
        lowered = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()],
                                              constant_methods=next(iter(models.values())).get_metadata())
        path.write_bytes(lowered.to_executorch().buffer)


# Which evictor serves which mode of the reference bundle: the hybrid one (kv_forward at ar_len 1,
# prefill_forward at the prefill's) serves kv mode too; lookahead's decode method is wider.
def evictor_methods(prefill_ar_len: int, lookahead_ar_len: int) -> dict[str, dict[str, int]]:
    return {EVICTOR_PTE: {"kv_forward": 1, "prefill_forward": prefill_ar_len},
            LOOKAHEAD_EVICTOR_PTE: {"kv_forward": lookahead_ar_len, "prefill_forward": prefill_ar_len}}


MODE_EVICTORS = {"kv": EVICTOR_PTE, "hybrid": EVICTOR_PTE, "lookahead": LOOKAHEAD_EVICTOR_PTE}


def add_to_manifest(manifest: Path) -> None:
    """List the evictors in a reference manifest written by farm.bundle.export.write_manifest: each a
    file (role "other": neither the decoder nor the tokenizer) and named by the modes it serves
    (Mode.attention_sink_rope, passed as --attention_sink_rope_path)."""
    from farm.bundle.manifest import describe_file, load

    bundle = load(manifest)
    out = manifest.parent
    for pte in dict.fromkeys(MODE_EVICTORS.values()):
        bundle.files.append(describe_file(out, out / pte, role="other"))
    from dataclasses import replace

    bundle.modes = {key: replace(mode, attention_sink_rope=MODE_EVICTORS[key])
                    for key, mode in bundle.modes.items()}
    bundle.write(manifest)
