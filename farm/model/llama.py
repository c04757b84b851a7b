"""A small reference llama with the static-llama I/O contract of ExecuTorch's Qualcomm example (v1.0.1).

Two views of the same weights:
- ``StaticLlama``: what gets exported. Fixed ``ar_len``; inputs ``tokens [1, ar]``, ``atten_mask
  [1, ar, max_seq_len]``, ``input_pos [1, ar]``, then one K cache per layer x kv head ``[1, head_dim,
  cache_len]`` (transposed), then one V cache per layer x kv head ``[1, cache_len, head_dim]``, with
  ``cache_len = max_seq_len - ar``. Outputs ``logits [1, ar, vocab]``, then the new K ``[1, head_dim, ar]``
  and the new V ``[1, ar, head_dim]`` entries only: the caller (the runner's KV updater) owns the cache.
- ``eager_logits``: full causal attention over a whole sequence, no cache: the ground truth that both
  updaters must reproduce.

RMSNorm, RoPE at absolute positions, grouped-query attention (n_kv_heads < n_heads), SwiGLU MLP.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from farm.model.config import CONFIGS, LlamaConfig  # noqa: F401  (re-exported)

# Added to masked attention scores. Finite (not -inf) so that a row can never become NaN.
MASK_MIN = -1.0e9
# Logit bias of special tokens: random weights would otherwise end generations at random; the reference
# model never emits them, so a generation's length is set by --seq_len alone.
SPECIAL_LOGIT_BIAS = -1.0e4


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    half = cfg.head_dim // 2
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64), freqs)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [ar, heads, head_dim]; cos/sin [ar, head_dim/2]. Rotates (first half, second half) pairs."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        hd = cfg.head_dim
        self.cfg = cfg
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [ar, dim] -> q [ar, H, hd], k [ar, KV, hd], v [ar, KV, hd]; RoPE applied to q and k."""
        cfg, ar = self.cfg, x.shape[0]
        h = self.attn_norm(x)
        q = self.wq(h).view(ar, cfg.n_heads, cfg.head_dim)
        k = self.wk(h).view(ar, cfg.n_kv_heads, cfg.head_dim)
        v = self.wv(h).view(ar, cfg.n_kv_heads, cfg.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """q [ar, H, hd]; keys [KV, hd, S] (transposed); values [KV, S, hd]; mask [ar, S] -> [ar, H*hd]."""
        cfg, ar = self.cfg, q.shape[0]
        group = cfg.n_heads // cfg.n_kv_heads
        # [KV, group, ar, hd]: query heads grouped under the kv head they share.
        # A kv head's query rows stacked ([KV, group * ar, hd]) meet its cache in one bmm. A
        # broadcast over the group, or matmul's own expand, is lowered as portable expand_copy: a copy
        # of every cache per step (per group), outside XNNPACK, which was most of a step's time at a
        # 4096 context. Same products, same sums: the tokens do not change.
        qg = q.view(ar, cfg.n_kv_heads, group, cfg.head_dim).permute(1, 2, 0, 3)
        qg = qg.reshape(cfg.n_kv_heads, group * ar, cfg.head_dim)
        scores = torch.bmm(qg, keys) / math.sqrt(cfg.head_dim)
        scores = scores.view(cfg.n_kv_heads, group, ar, -1) + mask
        probs = torch.softmax(scores, dim=-1).view(cfg.n_kv_heads, group * ar, -1)
        out = torch.bmm(probs, values).view(cfg.n_kv_heads, group, ar, cfg.head_dim)
        return out.permute(2, 0, 1, 3).reshape(ar, cfg.n_heads * cfg.head_dim)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mlp_norm(x)
        return self.w2(nn.functional.silu(self.w1(h)) * self.w3(h))


class LlamaWeights(nn.Module):
    """The parameters, shared by the exported static model and the eager reference."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        cfg.validate()
        if cfg.vocab_size <= 0:
            raise ValueError(f"config {cfg.name}: vocab_size not set (it comes from the tokenizer)")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=True)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        # Seeded, and scaled so that attention is sharp enough for the next token to depend on the
        # cached context (tests/test_model.py proves it): q/k get a larger gain than the usual init.
        gen = torch.Generator().manual_seed(self.cfg.seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                continue
            fan_in = p.shape[-1] if p.dim() > 1 else self.cfg.dim
            gain = 3.0 if name.endswith(("wq.weight", "wk.weight")) else 1.0
            if name == "embed.weight":
                gain = math.sqrt(fan_in)
            p.copy_(torch.randn(p.shape, generator=gen) * gain / math.sqrt(fan_in))
        self.output.bias.zero_()
        self.output.bias[self.cfg.n_base_tokens:] = SPECIAL_LOGIT_BIAS
        self.output.bias[list(self.cfg.partial_pieces)] = SPECIAL_LOGIT_BIAS  # see LlamaConfig


class StaticLlama(nn.Module):
    """The exported form: one fixed ar_len, caches as inputs, new cache entries as outputs."""

    def __init__(self, weights: LlamaWeights, ar_len: int):
        super().__init__()
        self.w = weights
        self.ar_len = ar_len
        self.cache_len = weights.cfg.max_seq_len - ar_len

    def forward(self, tokens: torch.Tensor, atten_mask: torch.Tensor, input_pos: torch.Tensor,
                *caches: torch.Tensor):
        cfg = self.w.cfg
        n = cfg.n_layers * cfg.n_kv_heads
        k_caches, v_caches = caches[:n], caches[n:]
        pos = input_pos[0].long()
        cos, sin = self.w.rope_cos[pos], self.w.rope_sin[pos]
        mask = atten_mask[0]
        x = self.w.embed(tokens[0].long())
        new_k: list[torch.Tensor] = []
        new_v: list[torch.Tensor] = []
        for li, layer in enumerate(self.w.layers):
            q, k, v = layer.qkv(x, cos, sin)
            heads = range(li * cfg.n_kv_heads, (li + 1) * cfg.n_kv_heads)
            k_t = k.permute(1, 2, 0)  # [KV, hd, ar]
            v_h = v.permute(1, 0, 2)  # [KV, ar, hd]
            keys = torch.cat([torch.cat([k_caches[h] for h in heads]), k_t], dim=-1)
            values = torch.cat([torch.cat([v_caches[h] for h in heads]), v_h], dim=1)
            x = x + layer.wo(layer.attend(q, keys, values, mask))
            x = x + layer.mlp(x)
            new_k.extend(k_t[i : i + 1] for i in range(cfg.n_kv_heads))
            new_v.extend(v_h[i : i + 1] for i in range(cfg.n_kv_heads))
        logits = self.w.output(self.w.norm(x)).unsqueeze(0)
        return (logits, *new_k, *new_v)

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        cfg, ar, cl = self.w.cfg, self.ar_len, self.cache_len
        n = cfg.n_layers * cfg.n_kv_heads
        mask = torch.full((1, ar, cfg.max_seq_len), MASK_MIN)
        mask[0, :, cl:] = causal_block(ar)
        return (
            torch.zeros(1, ar, dtype=torch.int32),
            mask,
            torch.arange(ar, dtype=torch.int32).unsqueeze(0),
            *[torch.zeros(1, cfg.head_dim, cl) for _ in range(n)],
            *[torch.zeros(1, cl, cfg.head_dim) for _ in range(n)],
        )


def causal_block(ar: int) -> torch.Tensor:
    """The mask of the current tokens among themselves: 0 on and below the diagonal."""
    return torch.triu(torch.full((ar, ar), MASK_MIN), diagonal=1)


@torch.no_grad()
def eager_logits(weights: LlamaWeights, token_ids: list[int]) -> torch.Tensor:
    """Logits [len, vocab] of a whole sequence with full causal attention and no cache."""
    return eager_logits_of_embeddings(weights, weights.embed(torch.tensor(token_ids)))


@torch.no_grad()
def eager_logits_of_embeddings(weights: LlamaWeights, x: torch.Tensor) -> torch.Tensor:
    """Logits [len, vocab] of a sequence of input embeddings [len, dim] (a multimodal prompt's token
    and image embeddings), full causal attention, no cache."""
    n = x.shape[0]
    cos, sin = weights.rope_cos[:n], weights.rope_sin[:n]
    mask = causal_block(n)
    for layer in weights.layers:
        q, k, v = layer.qkv(x, cos, sin)
        x = x + layer.wo(layer.attend(q, k.permute(1, 2, 0), v.permute(1, 0, 2), mask))
        x = x + layer.mlp(x)
    return weights.output(weights.norm(x))


@torch.no_grad()
def eager_generate(weights: LlamaWeights, prompt_ids: list[int], seq_len: int) -> list[int]:
    """Greedy tokens after the prompt until seq_len tokens in all: the ground truth for the runner."""
    ids = list(prompt_ids)
    while len(ids) < seq_len:
        ids.append(int(eager_logits(weights, ids)[-1].argmax()))
    return ids[len(prompt_ids):]
