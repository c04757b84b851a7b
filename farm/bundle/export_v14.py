"""`farm export --layout v1.4`: the reference bundle in ExecuTorch 1.4.1's I/O layout, exported with the
static llama the wheel ships (farm/model/upstream_llama.py) and the v1.0.1 reference's weights.

What 1.4.1 puts in a program (sources at tag v1.4.1, examples/qualcomm/oss_scripts/llama/):

- Methods: the decoder at ar_len 1 as ``kv_forward`` and, in hybrid and lookahead programs, at the
  prefill's ar_len as ``prefill_forward``, in one .pte (decoder_constants.py DECODER_GRAPH_NAMES
  ``["kv_forward", "prefill_forward"]``, zipped with [decode, prefill] in llm_wrappers.py:985-987; kv
  mode builds no prefill model, llm_wrappers.py:343-344). Lookahead's kv_forward has ar_len
  next_power_of_two((window + gcap) * (ngram - 1)) (base_component.py:93-101).
- I/O per method (model/static_llama.py): inputs tokens [1, AR] int32, atten_mask [1, 1, AR, CL]
  (masking_utils.py:39: one mask row set broadcast over heads), input_pos [1, AR] int32, one k cache
  [1, n_kv_heads, head_dim, CL - AR] per layer, then one v cache [1, n_kv_heads, CL - AR, head_dim] per
  layer (SL:765-793); outputs the logits [1, AR, vocab], then the new k [1, n_kv_heads, head_dim, AR]
  per layer, then the new v [1, n_kv_heads, AR, head_dim] per layer (output_new_cache_only).
- Metadata (constant methods, llm_wrappers.py:1044 ``constant_methods={**self.decode.meta}``): the
  decode model's get_metadata() (SL:807-824): get_ar_len (the decode method's: 1), get_bos_id 1 and
  get_eos_id 2 (literals upstream, whatever the tokenizer: nothing in 1.4.1 reads them, the runner takes
  BOS/EOS from its tokenizer, runner.cpp:182-214), get_dim, get_head_dim, get_max_batch_size,
  get_max_seq_len, get_max_context_len, get_n_bos 1, get_n_eos 1, get_n_kv_heads, get_n_layers,
  get_vocab_size, get_use_kv_cache, get_kv_io_bit_width (the quant recipe's, base_component.py:118;
  32 for a float program). A quantized export adds get_logits_scale / get_logits_zero_point
  (llm_wrappers.py:424-435) and get_kv_output_<i>_quant_attr (llm_wrappers.py:437-450).
  This float program carries get_logits_scale 1.0 and get_logits_zero_point 0 too: what
  retrieve_info_from_pte (utils.py:21-70) reads, and substitutes for a 32-bit program (utils.py:53-56).
- What reads them: runner.cpp reads get_n_layers (runner.cpp:229) and get_sliding_window when present
  (runner.cpp:271); everything else from shapes: vocab from output 0 (runner.cpp:221), n_heads and
  head_dim from output 1 (runner.cpp:234-236), ar_len and context_len from input 1 (runner.cpp:246-259).
  retrieve_info_from_pte reads get_vocab_size, get_max_seq_len, get_max_context_len,
  get_logits_scale, get_logits_zero_point, get_kv_io_bit_width (utils.py:34-49).
- File names: kv_llama_qnn.pte, hybrid_llama_qnn.pte, lookahead_llama_qnn.pte (llama.py:684-697).
- Beside them the attention-sink evictors (llama.py --use_attention_sink 4,32; farm/bundle/export_sink.py),
  which each mode of the manifest names (``attention_sink_rope``) for runs past the context window.

Lowered to XNNPACK instead of QNN, without llm_wrappers' HTP rewrites (linear as conv2d, the QNN
passes): the graph is the wheel's model as it stands. The bundle is cached like the v1.0.1 reference
(farm/bundle/export.py), under its own key (this layout and exporter version) and directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from farm.bundle import export_sink
from farm.bundle.export import (
    LOOKAHEAD,
    MANIFEST,
    STEPS,
    StepCallback,
    cache_key,
    default_cache_dir,
    program_bytes,
    publish,
    quietly,
    resolve_config,
    write_manifest,
    write_tokenizer,
)
from farm.bundle.manifest import Mode
from farm.model.config import LlamaConfig

LAYOUT = "v1.4"
EXPORTER_VERSION = "4"  # 2: UTF-8 output (LlamaConfig.partial_pieces); 3: the attention-sink evictors; 4: inputs in place
KV_PTE = "kv_llama_qnn.pte"
HYBRID_PTE = "hybrid_llama_qnn.pte"
LOOKAHEAD_PTE = "lookahead_llama_qnn.pte"
# What a float program adds beside the model's metadata (see the module's docstring).
FLOAT_LOGITS_QUANT = {"get_logits_scale": 1.0, "get_logits_zero_point": 0}


def bundle_dir(config_name: str, out_dir: str | os.PathLike | None = None) -> Path:
    """Where the v1.4 bundle of this config lives in the cache (exported or not)."""
    return _bundle_dir_of(resolve_config(config_name), out_dir)


def _bundle_dir_of(cfg: LlamaConfig, out_dir: str | os.PathLike | None) -> Path:
    root = Path(out_dir) if out_dir else default_cache_dir()
    key = cache_key(cfg, {"name": LAYOUT, "exporter": EXPORTER_VERSION,
                          "attention_sink": [export_sink.SINK_SIZE, export_sink.EVICTION_BATCH_SIZE]})
    return root / f"reference-{cfg.name}-v14-{key}"


def export_bundle(config_name: str = "tiny", out_dir: str | os.PathLike | None = None, *,
                  on_step: StepCallback | None = None) -> Path:
    """Export (or find in the cache) the config's v1.4 reference bundle; returns the manifest's path."""
    cfg = resolve_config(config_name)
    step = on_step or (lambda what, n, steps: None)
    return publish(_bundle_dir_of(cfg, out_dir), lambda staging: quietly(
        lambda: _export(cfg, staging, lambda n: step(STEPS[n - 1], n, len(STEPS)))))


def metadata(decode) -> dict[str, int | float | bool]:
    """The constant methods of a program: the decode model's metadata (SL:807-824) and the float
    logits' identity quantization."""
    return {**decode.get_metadata(), **FLOAT_LOGITS_QUANT}


def _export(cfg: LlamaConfig, out: Path, step: Callable[[int], None]) -> None:
    import torch

    from farm.model.llama import LlamaWeights

    step(1)
    tokenizer, cfg = write_tokenizer(cfg, out)
    weights = LlamaWeights(cfg).eval()
    lookahead = Mode(pte=LOOKAHEAD_PTE, eval_mode=2, ar_len=cfg.prefill_ar_len, **LOOKAHEAD)
    programs = {KV_PTE: {"kv_forward": 1},
                HYBRID_PTE: {"kv_forward": 1, "prefill_forward": cfg.prefill_ar_len},
                LOOKAHEAD_PTE: {"kv_forward": lookahead.decode_ar_len,
                                "prefill_forward": cfg.prefill_ar_len}}
    # Every distinct ar_len is lowered once and each .pte assembled from those methods, as the v1.0.1
    # exporter does (farm/bundle/export.py _lower_ar_lens): lowering is most of an export's time.
    with torch.no_grad():
        step(2)
        models, lowered = _lower_ar_lens(weights, {ar for p in programs.values() for ar in p.values()})
        step(3)
        for pte, methods in programs.items():
            write_program(lowered, {name: f"ar{ar}" for name, ar in methods.items()},
                           metadata(models[methods["kv_forward"]]), out / pte)
        for pte, methods in export_sink.evictor_methods(cfg.prefill_ar_len, lookahead.decode_ar_len).items():
            export_sink.write_evictor(cfg, methods, out / pte)
    step(4)
    # "io_layout" tells a reader of the manifest which layout the programs have; the runner reads it
    # from the programs themselves (farm/runner/io_v14.py is_v14).
    write_manifest(out, cfg, name=f"reference-{cfg.name}-v14", tokenizer=tokenizer,
                   programs=(KV_PTE, HYBRID_PTE), lookahead=lookahead,
                   model={"io_layout": LAYOUT, "exporter_version": EXPORTER_VERSION,
                          "attention_sink": {"sink_size": export_sink.SINK_SIZE,
                                             "eviction_batch_size": export_sink.EVICTION_BATCH_SIZE}})
    export_sink.add_to_manifest(out / MANIFEST)


def _lower_ar_lens(weights, ar_lens: set[int]):
    """The wheel's decoder at each ar_len (by ar_len) and all of them lowered to XNNPACK together
    (methods ``ar<N>``), as llm_wrappers.py:1038-1046 lowers [decode, prefill] in one call."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from farm.model import upstream_llama

    models = {ar: upstream_llama.decoder(weights, ar) for ar in sorted(ar_lens)}
    exported = {f"ar{ar}": torch.export.export(m, upstream_llama.export_inputs(m), strict=False)
                for ar, m in models.items()}
    return models, to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])


def write_program(lowered, methods: dict[str, str], constants: dict, path: Path) -> None:
    """One .pte of the lowered methods under 1.4.1's names, with the decode model's metadata as its
    constant methods (llm_wrappers.py:1044)."""
    from executorch.exir import EdgeProgramManager

    program = EdgeProgramManager({name: lowered.exported_program(src) for name, src in methods.items()},
                                 constants, lowered.compile_config)
    path.write_bytes(program_bytes(program))
