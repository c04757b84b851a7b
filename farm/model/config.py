"""Reference llama configs. Kept free of torch so that the CLI and the cache check start fast."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LlamaConfig:
    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    max_seq_len: int
    prefill_ar_len: int  # ar_len of the hybrid mode's prefill method
    vocab_size: int = 0  # filled in from the tokenizer (base tokens + special tokens)
    n_base_tokens: int = 0  # tokens below this id are ordinary text tokens
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> None:
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"config {self.name}: heads must divide dim and kv heads divide heads")
        if self.head_dim % 2:
            raise ValueError(f"config {self.name}: head_dim must be even for RoPE")
        if not 1 < self.prefill_ar_len < self.max_seq_len:
            raise ValueError(f"config {self.name}: prefill_ar_len must be in (1, max_seq_len)")


# Named configs. `tiny` keeps the test suite short; `small` has the context of the upstream SM8650
# measurement (kv length 4096, prefill 128) for benchmarks.
CONFIGS: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128,
                        max_seq_len=128, prefill_ar_len=16, seed=1234),
    "small": LlamaConfig(name="small", dim=256, n_layers=4, n_heads=8, n_kv_heads=2, hidden_dim=512,
                         max_seq_len=4096, prefill_ar_len=128, seed=4321),
}
