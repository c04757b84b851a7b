"""The static llama of ExecuTorch 1.4.1 as the wheel ships it (examples/qualcomm/oss_scripts/llama/model/
static_llama.py, SL below), built for the farm's reference configs and loaded with their weights.

The model code is the wheel's own, not a copy: ``static_llama()`` imports it. Its package's
``__init__.py`` (examples/qualcomm/oss_scripts/llama/__init__.py) imports every model family upstream
supports, their checkpoint converters and safetensors; a bare package module with the package's
``__path__`` stands in for it, so only the model's own modules run. The model package's feed_forward.py
imports ``transformers.activations.GELUActivation`` for CodeGen's MLP alone; the wheel does not
install transformers, so while the model imports (and only then) a stand-in module provides a
GELUActivation that refuses to be built. Nothing here imports ``executorch.backends.qualcomm``
(which tries to download the QNN SDK).

The weights are the v1.0.1 reference's (farm/model/llama.py ``LlamaWeights``, seeded by the config),
renamed to the upstream module's parameter names: the same checkpoint in the other layout.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import torch

from farm.model.config import LlamaConfig
from farm.model.llama import LlamaWeights

PACKAGE = "executorch.examples.qualcomm.oss_scripts.llama"
KV_IO_BIT_WIDTH = 32  # a float program (utils.py:53-56 reads 32 as "no quantized I/O")


def static_llama() -> types.ModuleType:
    """The wheel's ``...oss_scripts.llama.model.static_llama``, imported without its package's
    ``__init__.py``."""
    name = f"{PACKAGE}.model.static_llama"
    if name in sys.modules:
        return sys.modules[name]
    import executorch

    if PACKAGE not in sys.modules:
        bare = types.ModuleType(PACKAGE)
        bare.__path__ = [str(Path(executorch.__path__[0]) / "examples/qualcomm/oss_scripts/llama")]
        sys.modules[PACKAGE] = bare
    stand_ins = _transformers_stand_in() if importlib.util.find_spec("transformers") is None else {}
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module(name)
    finally:
        for key in stand_ins:
            sys.modules.pop(key, None)


def token_embedding_module() -> types.ModuleType:
    """The wheel's ``...oss_scripts.llama.model.embedding`` (TokenEmbedding, what llama.py exports as
    tok_embedding_qnn.pte), imported as ``static_llama()`` imports its module."""
    static_llama()  # the bare package
    return importlib.import_module(f"{PACKAGE}.model.embedding")


def decoder_of_embeddings(weights: LlamaWeights, ar_len: int):
    """SL's LlamaModelWithoutEmbedding (a multimodal text decoder: input embeddings in place of
    tokens) at one ar_len with the reference weights, built as ``decoder`` builds LlamaModel."""
    model = static_llama().LlamaModelWithoutEmbedding(model_args(weights.cfg), ar_len=ar_len,
                                                      output_new_cache_only=True, output_cache=True,
                                                      use_i64_token=False)
    model.load_state_dict(state_dict(weights), strict=True)
    return model.eval()


def _transformers_stand_in() -> dict[str, types.ModuleType]:
    """``transformers.activations`` as model/feed_forward.py:11 imports it: only CodeGen's MLP
    (feed_forward.py:55) builds a GELUActivation, which no reference config uses."""

    class GELUActivation(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            raise RuntimeError("transformers is not installed: CodeGen's feed forward needs it")

    package = types.ModuleType("transformers")
    package.__path__ = []
    activations = types.ModuleType("transformers.activations")
    activations.GELUActivation = GELUActivation
    return {"transformers": package, "transformers.activations": activations}


def model_args(cfg: LlamaConfig):
    """SL's ModelArgs for a reference config, as llama.py's process_model_args sets them for a
    runtime graph (wrappers/base_component.py:110-118): batch 1, max_context_len = max_seq_len
    (llama.py:675-676 when --max_context_len is not given), the KV cache on."""
    sl = static_llama()
    return sl.ModelArgs(
        dim=cfg.dim, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
        vocab_size=cfg.vocab_size, hidden_dim=cfg.hidden_dim, norm_eps=cfg.norm_eps,
        rope_freq_base=cfg.rope_theta, max_batch_size=1, max_seq_len=cfg.max_seq_len,
        max_context_len=cfg.max_seq_len, use_kv_cache=True, kv_io_bit_width=KV_IO_BIT_WIDTH,
        # The reference's logits carry a bias (the special tokens' SPECIAL_LOGIT_BIAS).
        output_bias=True,
    )


def state_dict(weights: LlamaWeights) -> dict[str, torch.Tensor]:
    """The reference weights under SL's parameter names (LlamaModel, LlamaDecoderLayer). Both rotate
    (first half, second half) pairs, so no permutation (llm_wrappers.py's transform_weight) applies."""
    ours = weights.state_dict()
    out = {"tok_embeddings.weight": ours["embed.weight"], "norm.weight": ours["norm.weight"],
           "output.weight": ours["output.weight"], "output.bias": ours["output.bias"]}
    names = {"attn_norm": "attention_norm", "mlp_norm": "ffn_norm", "wq": "attention.wq",
             "wk": "attention.wk", "wv": "attention.wv", "wo": "attention.wo",
             "w1": "feed_forward.w1", "w2": "feed_forward.w2", "w3": "feed_forward.w3"}
    for i in range(weights.cfg.n_layers):
        for src, dst in names.items():
            out[f"layers.{i}.{dst}.weight"] = ours[f"layers.{i}.{src}.weight"]
    return out


def decoder(weights: LlamaWeights, ar_len: int):
    """SL's LlamaModel at one ar_len with the reference weights, as llm_wrappers.py builds the
    decoder (llm_wrappers.py:371-380: output_new_cache_only, output_cache, int32 tokens) and loads
    a checkpoint (load_state_dict strict, llm_wrappers.py:288)."""
    model = static_llama().LlamaModel(model_args(weights.cfg), ar_len=ar_len,
                                      output_new_cache_only=True, output_cache=True,
                                      use_i64_token=False)
    model.load_state_dict(state_dict(weights), strict=True)
    return model.eval()


def export_inputs(model) -> tuple[torch.Tensor, ...]:
    """The flat example inputs llm_wrappers.py:386-392 exports with: tokens, the attention mask(s),
    input_pos, the k caches, the v caches (one each per layer)."""
    tokens, masks, pos, k_caches, v_caches = model.get_example_inputs()
    # The mask is an expand() of one row set; its values never reach the exported graph.
    return (torch.zeros_like(tokens), *(m.contiguous() for m in masks), pos, *k_caches, *v_caches)


def _meta_layout(w: torch.Tensor, heads: int) -> torch.Tensor:
    """A q or k projection in Meta's checkpoint layout (each head's RoPE pairs interleaved), the
    inverse of llm_wrappers.py:253-266's ``permute``, which a config with ``transform_weight`` applies
    to a checkpoint on loading to get SL's (first half, second half) pairs back."""
    rows, cols = w.shape
    return w.view(heads, 1, 2, rows // heads // 2, cols).transpose(2, 3).reshape(rows, cols).contiguous()


def write_checkpoint(weights: LlamaWeights, out_dir: Path) -> tuple[Path, Path]:
    """The reference as llama.py takes a model of the llama families (``--checkpoint``, ``--params``):
    a torch state dict in Meta's layout, which llm_wrappers.py:241-270 loads and permutes for SL (for
    the configs with ``transform_weight``: llama3_2, stories), and SL's ModelArgs as JSON. Upstream's
    own scripts then build the float model the device's logits are compared with (SqnrEval)."""
    import json

    cfg = weights.cfg
    sd = state_dict(weights)
    for i in range(cfg.n_layers):
        sd[f"layers.{i}.attention.wq.weight"] = _meta_layout(sd[f"layers.{i}.attention.wq.weight"], cfg.n_heads)
        sd[f"layers.{i}.attention.wk.weight"] = _meta_layout(sd[f"layers.{i}.attention.wk.weight"], cfg.n_kv_heads)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint, params = out_dir / "consolidated.00.pth", out_dir / "params.json"
    torch.save({k: v.detach().clone() for k, v in sd.items()}, checkpoint)
    params.write_text(json.dumps({"dim": cfg.dim, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                                  "n_kv_heads": cfg.n_kv_heads, "vocab_size": cfg.vocab_size,
                                  "hidden_dim": cfg.hidden_dim, "norm_eps": cfg.norm_eps,
                                  "rope_freq_base": cfg.rope_theta, "output_bias": True}, indent=1) + "\n")
    return checkpoint, params
