"""The attention sink of qnn_llama_runner v1.4.1 (``--attention_sink_rope_path``): a second program, the
evictor (farm/bundle/export_sink.py), run on the KV caches when the next step would not fit, so that
generation goes on past the context window.

Sources at tag v1.4.1, examples/qualcomm/oss_scripts/llama/runner/: ASR = attention_sink_rope_runner.cpp,
RUN = runner.cpp, PP = prompt_processor.cpp, TG = token_generator.cpp, LHD = lhd_token_generator.cpp.

- Loading (RUN:287-292, ASR:33-46): the evictor's methods named as the decoder's (kv mode: kv_forward;
  hybrid and lookahead: kv_forward and prefill_forward) and ``get_eviction_batch_size``.
- Before every step (PP:314-332 each prefill chunk, TG:278-296 each token, LHD:255-263 each lookahead
  step): when ``shifted_pos + ar_len > context_len - ar_len`` (lookahead: ``+ ngram``), the evictor's
  method of the decoder method about to run takes the caches as inputs and writes its outputs into the
  same buffers (ASR:20-29 set_outputs with the cache inputs, PP:276-284, TG:244-251), then
  ``shifted_pos -= eviction_batch_size`` and the attention mask is initialised anew at shifted_pos.
- ``position_shift`` (ASR:54-64) grows by eviction_batch_size per eviction and is shared by the prompt
  processor and the token generator: a step's cache position, and the position its tokens are fed at
  (TG:299 prepare_io(cur_token, shifted_pos)), is the absolute position minus it. The re-rotation of the
  kept keys to their new positions is the evictor's (model/static_llama.py AttentionSinkRope).

The host runtime returns outputs in memory of its own, so they are copied into the cache buffers; on a
phone the output tensors are bound to those buffers.
"""

from __future__ import annotations

from pathlib import Path

import torch

from farm.errors import UsageError

FLAG = "--attention_sink_rope_path"
BATCH_METHOD = "get_eviction_batch_size"  # ASR:43-45


class AttentionSink:
    """AttentionSinkRopeRunner: the evictor's methods for the decoder's, its batch size and the
    position shift so far."""

    def __init__(self, path: str, program, decoder_methods: dict[str, object]):
        """``program``: the evictor at ``path``, loaded (executorch.runtime's Program);
        ``decoder_methods``: the decoder's loaded methods by name (the ones this run uses)."""
        p = Path(path)
        names = set(program.method_names)
        # RUN:290-291 -> ASR:37-41: Module::load_method of each decoder method's name fails on a
        # program without it; the phone's runner aborts there too.
        if missing := [m for m in decoder_methods if m not in names]:
            raise UsageError(f"{FLAG}: {p} has no method {missing[0]!r} (the decoder runs "
                             f"{', '.join(decoder_methods)}; the evictor has: {', '.join(sorted(names))})"
                             " - an evictor is exported for one decoder (llama.py --use_attention_sink)")
        if BATCH_METHOD not in names:
            raise UsageError(f"{FLAG}: {p} lacks metadata method {BATCH_METHOD!r}")
        self.methods = {name: program.load_method(name) for name in decoder_methods}
        for name, decoder in decoder_methods.items():
            if wrong := _mismatch(self.methods[name].metadata, decoder.metadata):
                raise UsageError(f"{FLAG}: {p}: method {name!r} {wrong}: it was exported for another "
                                 "decoder (context length, ar_len or layers)")
        self.eviction_batch_size = int(program.load_method(BATCH_METHOD).execute([])[0])
        if self.eviction_batch_size < 1:
            raise UsageError(f"{FLAG}: {p}: {BATCH_METHOD} is {self.eviction_batch_size}")
        self.position_shift = 0
        self.evictions = 0

    @staticmethod
    def needs_room(shifted_pos: int, step_len: int, context_len: int, ar_len: int) -> bool:
        """PP:314-316, TG:278-280 (step_len = ar_len), LHD:255-257 (step_len = ngram)."""
        return shifted_pos + step_len > context_len - ar_len

    def evict(self, method_name: str, caches: list[torch.Tensor]) -> None:
        """ASR:56-66: run the evictor's ``method_name`` on the caches (k per layer, then v per layer),
        its outputs written back into them; the caller moves shifted_pos and re-initialises the mask."""
        outputs = self.methods[method_name].execute(caches)
        for cache, out in zip(caches, outputs, strict=True):
            cache.copy_(out)
        self.position_shift += self.eviction_batch_size
        self.evictions += 1


def _mismatch(evictor_meta, decoder_meta) -> str | None:
    """Why the evictor's method cannot take the decoder method's caches (its inputs 3.. ,
    farm/runner/io_v14.py), or None: the same count and shapes in, the same out."""
    caches = [tuple(decoder_meta.input_tensor_meta(i).sizes()) for i in range(3, decoder_meta.num_inputs())]
    ins = [tuple(evictor_meta.input_tensor_meta(i).sizes()) for i in range(evictor_meta.num_inputs())]
    outs = [tuple(evictor_meta.output_tensor_meta(i).sizes()) for i in range(evictor_meta.num_outputs())]
    if ins != caches:
        return (f"takes {len(ins)} tensors {ins[:1]}..., the decoder's caches are {len(caches)} "
                f"{caches[:1]}...")
    if outs != caches:
        return (f"returns {len(outs)} tensors {outs[:1]}..., the decoder's caches are {len(caches)} "
                f"{caches[:1]}...")
    return None
