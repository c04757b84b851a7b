"""A tiny vision encoder of SmolVLM's shape (Idefics3: a ViT, then a pixel-shuffle connector), the
reference vision-language bundle's image model.

Upstream 1.4.1 exports SmolVLM's encoder from examples/qualcomm/oss_scripts/llama/model/vision_encoder.py
(``Idefics3VisionEncoder``: patch embeddings, a transformer encoder, post-layernorm, then
``Idefics3Connector``'s pixel shuffle and a bias-free projection to the decoder's dim). That module
imports ``executorch.examples.qualcomm.utils``, which imports ``executorch.backends.qualcomm`` (and with
it a download of the QNN SDK) and transformers: the farm never imports either, so this is the same
architecture, written small and seeded like the decoder (farm/model/llama.py).

    pixel_values [1, 3, image_size, image_size] float32  ->  image embeddings [1, n_image_tokens, dim]

with ``n_image_tokens = (image_size / patch_size)^2 / scale_factor^2``: what the runner merges in place
of the prompt's image placeholder tokens.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from farm.model.config import VisionConfig


class _Layer(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.norm1 = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm2 = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.fc1 = nn.Linear(cfg.hidden, cfg.mlp)
        self.fc2 = nn.Linear(cfg.mlp, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.cfg.n_heads
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // h)  # every patch sees every patch
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(attn)
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


class VisionEncoder(nn.Module):
    """Idefics3VisionEncoder's forward, small: pixels in, the decoder's input embeddings out."""

    def __init__(self, cfg: VisionConfig, text_dim: int):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.patch = nn.Conv2d(3, cfg.hidden, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.position = nn.Parameter(torch.zeros(cfg.n_patches, cfg.hidden))
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.n_layers))
        self.post_norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        # Idefics3SimpleMLP: one bias-free projection of the shuffled patches to the decoder's dim
        self.connector = nn.Linear(cfg.hidden * cfg.scale_factor ** 2, text_dim, bias=False)
        # Every parameter from the config's seed: torch's default init of the biases draws from the
        # process's global generator, which would make two exports of one config differ.
        gen = torch.Generator().manual_seed(cfg.seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name == "position":
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
                elif p.dim() > 1:
                    p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
                elif name.endswith("bias"):
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
                else:  # a LayerNorm's scale
                    p.fill_(1.0)

    def example_inputs(self) -> tuple[torch.Tensor]:
        return (torch.zeros(1, 3, self.cfg.image_size, self.cfg.image_size),)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patch(pixel_values).flatten(2).transpose(1, 2) + self.position
        for layer in self.layers:
            x = layer(x)
        return self.connector(pixel_shuffle(self.post_norm(x), self.cfg.scale_factor))


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """Idefics3Connector.pixel_shuffle: each scale x scale block of patches becomes one token of
    scale^2 times the width."""
    b, seq, d = x.shape
    side = math.isqrt(seq)
    x = x.reshape(b, side, side // scale, d * scale).permute(0, 2, 1, 3)
    x = x.reshape(b, side // scale, side // scale, d * scale * scale).permute(0, 2, 1, 3)
    return x.reshape(b, seq // (scale * scale), d * scale * scale)


def test_image(cfg: VisionConfig, seed: int) -> torch.Tensor:
    """A deterministic picture (smooth gradients and a seeded pattern), normalized as SmolVLM's
    processor leaves pixels (mean 0.5, std 0.5: values in [-1, 1]), [1, 3, size, size] float32."""
    gen = torch.Generator().manual_seed(seed)
    size = cfg.image_size
    ramp = torch.linspace(-1.0, 1.0, size)
    base = torch.stack([ramp.view(1, -1).expand(size, size), ramp.view(-1, 1).expand(size, size),
                        (ramp.view(1, -1) * ramp.view(-1, 1))])
    noise = torch.rand(3, size, size, generator=gen) * 2 - 1
    return (0.5 * base + 0.5 * noise).clamp(-1, 1).unsqueeze(0).contiguous()
