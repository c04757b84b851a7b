"""Reference llama configs. Kept free of torch so that the CLI and the cache check start fast."""

from __future__ import annotations

from dataclasses import asdict, dataclass


LLAMA2C_BOS = 1
LLAMA2C_SPECIALS = (0, 1, 2)  # <unk>, <s>, </s>: the first ids of a SentencePiece vocabulary


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
    # The family the bundle is of: qnn_llama_runner's --decoder_model_version (chat template and end
    # tokens, farm/model/template.py) and the tokenizer's format (farm/model/tokenizer.py FORMATS).
    decoder_model_version: str = "llama3"
    tokenizer_format: str = "tiktoken"
    # Filled in from the tokenizer: the text tokens whose piece alone is not UTF-8 (a byte-level BPE's
    # lone bytes 0x80-0xFF and merges of them). The reference never writes them (their logits are
    # biased down as the special tokens' are), so what it writes is UTF-8 text, as upstream's
    # evaluators read outputs.txt (device_evaluator.py post_process_model_output); prompts still
    # encode every byte. A llama2c vocabulary's specials come first (LLAMA2C_SPECIALS) and are kept out
    # in the same list.
    partial_pieces: tuple[int, ...] = ()

    @property
    def bos_id(self) -> int:
        """The BOS token: a llama2c vocabulary's <s> (1); else the first special after the text."""
        return LLAMA2C_BOS if self.tokenizer_format == "llama2c" else self.n_base_tokens

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
        if self.tokenizer_format not in ("tiktoken", "hf", "llama2c"):
            raise ValueError(f"config {self.name}: tokenizer_format must be tiktoken, hf or llama2c (the "
                             "formats the exporter writes)")


# Named configs. `tiny` keeps the test suite short; `small` has the context of the upstream SM8650
# measurement (kv length 4096, prefill 128) for benchmarks. `tiny-qwen2_5` is the second family the main
# job qualifies: the qwen2_5 decoder model version with an HF tokenizer.json, the format of six of
# v1.0.1's eight families (qwen2_5, qwen3, smollm2, smollm3, phi_4_mini, gemma3) and of the qwen2_5-0_5b
# bundle whose thresholds the farm ships; a shorter prefill chunk (8) than tiny's puts chunk edges
# elsewhere. `tiny-stories` is the third: llama2 (upstream's stories110m/stories260k) with a llama2c
# tokenizer.bin exported from a SentencePiece model, the format of the stories families, prefill 12.
CONFIGS: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128,
                        max_seq_len=128, prefill_ar_len=16, seed=1234),
    "tiny-qwen2_5": LlamaConfig(name="tiny-qwen2_5", dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                hidden_dim=128, max_seq_len=128, prefill_ar_len=8, seed=2525,
                                decoder_model_version="qwen2_5", tokenizer_format="hf"),
    "tiny-stories": LlamaConfig(name="tiny-stories", dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                hidden_dim=128, max_seq_len=128, prefill_ar_len=12, seed=260,
                                decoder_model_version="llama2", tokenizer_format="llama2c"),
    "small": LlamaConfig(name="small", dim=256, n_layers=4, n_heads=8, n_kv_heads=2, hidden_dim=512,
                         max_seq_len=4096, prefill_ar_len=128, seed=4321),
}


@dataclass(frozen=True)
class VisionConfig:
    """The reference vision encoder (farm/model/vision.py): SmolVLM's shape, small."""

    image_size: int = 32
    patch_size: int = 4
    hidden: int = 32
    n_layers: int = 1
    n_heads: int = 2
    mlp: int = 64
    scale_factor: int = 2  # Idefics3Connector's pixel shuffle
    norm_eps: float = 1e-6
    seed: int = 77

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def n_image_tokens(self) -> int:
        return self.n_patches // self.scale_factor ** 2

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> None:
        side = self.image_size // self.patch_size
        if self.image_size % self.patch_size or side % self.scale_factor:
            raise ValueError("vision config: patch_size must divide image_size and scale_factor the patch grid")
        if self.hidden % self.n_heads:
            raise ValueError("vision config: n_heads must divide hidden")


# The reference vision-language bundle (farm/bundle/export_vlm.py): a text decoder of tiny's size in the
# smolvlm family (an HF tokenizer.json with SmolVLM's added tokens), its own seed, and the encoder.
VLM_CONFIGS: dict[str, tuple[LlamaConfig, VisionConfig]] = {
    "tiny-smolvlm": (LlamaConfig(name="tiny-smolvlm", dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                 hidden_dim=128, max_seq_len=128, prefill_ar_len=16, seed=5005,
                                 decoder_model_version="smolvlm", tokenizer_format="hf"),
                     VisionConfig()),
}
