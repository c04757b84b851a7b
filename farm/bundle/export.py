"""`farm export`: a reference bundle (kv, hybrid and lookahead .pte, tokenizer, manifest), cached by
content.

A config names its family (farm/model/config.py): tiny is llama3 with a tiktoken tokenizer.model,
tiny-qwen2_5 is qwen2_5 with an HF tokenizer.json.

The cache key is a digest of the model config, the tokenizer's training input and this exporter's
version (plus torch/executorch versions): the same config exports once per machine, and a change to any
of them exports anew into a new directory. A finished bundle is published by an atomic rename of its
directory, so a crash mid-export never leaves a bundle that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from farm.bundle.manifest import Bundle, Mode, describe_file
from farm.config import farm_home
from farm.errors import UsageError
from farm.model.config import CONFIGS, LLAMA2C_SPECIALS, LlamaConfig
from farm.model.tokenizer import (
    CORPUS,
    N_MERGES,
    QWEN2_PAT_STR,
    QWEN2_SPECIALS,
    SENTENCEPIECE_VOCAB,
    SMOLVLM_SPECIALS,
    train_ranks,
    write_hf_tokenizer,
    write_sentencepiece_tokenizer,
    write_tiktoken_model,
)

# Bump when the exported programs or the bundle layout change in a way the cache must not hide.
EXPORTER_VERSION = "5"  # 2: the lookahead program; 3: attention without a broadcast copy; 4: UTF-8 output (LlamaConfig.partial_pieces); 5: inputs in place (program_bytes)
KV_PTE = "kv_llama_xnnpack.pte"
HYBRID_PTE = "hybrid_llama_xnnpack.pte"
LOOKAHEAD_PTE = "lookahead_llama_xnnpack.pte"
# Lookahead decoding as the reference exports it (upstream exports lookahead_llama_qnn.pte the same
# way: prefill_forward as in hybrid mode, a kv_forward of ar_len
# next_power_of_two((window + gcap) * (ngram - 1)) that holds the guesses and their verification).
LOOKAHEAD = {"ngram": 3, "window": 4, "gcap": 4}
TOKENIZER = "tokenizer.model"
# The tokenizer's file name per format, as upstream's exports name it.
TOKENIZER_FILES = {"tiktoken": TOKENIZER, "hf": "tokenizer.json", "llama2c": "tokenizer.bin"}
# Beside a llama2c tokenizer.bin: the SentencePiece model it was exported from, which upstream's llama.py
# reads on the host (--tokenizer_model); not one of the bundle's files, as no device reads it.
SENTENCEPIECE_MODEL = "tokenizer.model"
MANIFEST = "manifest.json"


def resolve_config(name: str) -> LlamaConfig:
    if name not in CONFIGS:
        raise UsageError(f"--config: unknown config {name!r} (known: {', '.join(CONFIGS)})")
    return CONFIGS[name]


def cache_key(cfg: LlamaConfig, layout: dict | None = None) -> str:
    """``layout``: what else the key covers (farm/bundle/export_v14.py: the I/O layout and its
    exporter's version); None for this exporter's bundles, whose keys stay what they were."""
    # Versions from the installed distributions: importing torch would cost seconds on a cache hit.
    config = cfg.to_dict()
    tokenizer: list = [CORPUS, N_MERGES]
    if cfg.tokenizer_format == "hf":
        # HF's trainer learns the merges; the split pattern and the specials are the file's too.
        tokenizer += [_dist_version("tokenizers"), QWEN2_PAT_STR, list(hf_specials(cfg))]
    elif cfg.tokenizer_format == "llama2c":  # SentencePiece's trainer and upstream's exporter of it
        tokenizer += [_dist_version("sentencepiece"), _dist_version("pytorch-tokenizers"), SENTENCEPIECE_VOCAB]
    # A llama3/tiktoken config's key is what it was before configs had a family: its cache stays.
    for key, default in (("decoder_model_version", "llama3"), ("tokenizer_format", "tiktoken")):
        if config[key] == default:
            del config[key]
    material = json.dumps({"config": config, "exporter": EXPORTER_VERSION,
                           "tokenizer": tokenizer, "torch": _dist_version("torch"),
                           "executorch": _dist_version("executorch")}
                          | ({"layout": layout} if layout is not None else {}), sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def default_cache_dir() -> Path:
    return farm_home() / "exports"


def bundle_dir(config_name: str, out_dir: str | os.PathLike | None = None) -> Path:
    """Where the bundle of this config lives in the cache (whether or not it was exported yet)."""
    return _bundle_dir_of(resolve_config(config_name), out_dir)


def _bundle_dir_of(cfg: LlamaConfig, out_dir: str | os.PathLike | None) -> Path:
    root = Path(out_dir) if out_dir else default_cache_dir()
    return root / f"reference-{cfg.name}-{cache_key(cfg)}"


# Progress of an export: (what is being done, step number from 1, steps in all). Called before each
# step; a cache hit calls nothing. The exporter prints nothing itself: `farm export` shows it.
StepCallback = Callable[[str, int, int], None]
STEPS = ("training the tokenizer", "lowering the model to XNNPACK",
         "writing the kv, hybrid and lookahead programs", "writing the manifest")


def export_bundle(config_name: str = "tiny", out_dir: str | os.PathLike | None = None, *,
                  on_step: StepCallback | None = None) -> Path:
    """Export (or find in the cache) the reference bundle; returns the manifest's path."""
    return export_config(resolve_config(config_name), out_dir, on_step=on_step)


def export_config(cfg: LlamaConfig, out_dir: str | os.PathLike | None = None, *,
                  on_step: StepCallback | None = None) -> Path:
    """``export_bundle`` of a config that need not be one of the named ones (a benchmark's variant
    with another context length), cached under its own name and key."""
    step = on_step or (lambda what, n, steps: None)
    return publish(_bundle_dir_of(cfg, out_dir), lambda staging: _export_into(cfg, staging, step))


def publish(final: Path, build: Callable[[Path], None]) -> Path:
    """The manifest in ``final``, built there first unless it is already: ``build`` writes the bundle
    into a staging directory beside it, renamed to ``final`` once complete."""
    root = final.parent
    manifest = final / MANIFEST
    if manifest.is_file():
        return manifest
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out: cannot create {root}: {e.strerror}") from None
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        build(staging)
        try:
            os.rename(staging, final)
        except OSError:
            # Another process published the same bundle first: theirs is identical, keep it.
            if not manifest.is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def _export_into(cfg: LlamaConfig, out: Path, step: StepCallback) -> None:
    quietly(lambda: _export_quietly(cfg, out, lambda n: step(STEPS[n - 1], n, len(STEPS))))


def _export_quietly(cfg: LlamaConfig, out: Path, step: Callable[[int], None]) -> None:
    import torch

    step(1)
    tokenizer, cfg = write_tokenizer(cfg, out)

    from farm.model.llama import LlamaWeights

    weights = LlamaWeights(cfg).eval()
    metadata = _metadata_methods(cfg)
    lookahead = Mode(pte=LOOKAHEAD_PTE, eval_mode=2, ar_len=cfg.prefill_ar_len, **LOOKAHEAD)
    # Each program is a set of methods, each method the model at one ar_len; the kv program's
    # forward is the same model as hybrid's kv_forward. Every distinct ar_len is lowered once
    # (XNNPACK lowering is most of an export's time) and each .pte is assembled from them, byte for
    # byte what lowering each program on its own writes.
    programs = {KV_PTE: {"forward": 1},
                HYBRID_PTE: {"prefill_forward": cfg.prefill_ar_len, "kv_forward": 1},
                LOOKAHEAD_PTE: {"prefill_forward": cfg.prefill_ar_len,
                                "kv_forward": lookahead.decode_ar_len}}
    with torch.no_grad():
        step(2)
        lowered = _lower_ar_lens(weights, sorted({ar for p in programs.values() for ar in p.values()}),
                                 metadata)
        step(3)
        for pte, methods in programs.items():
            _write_program(lowered, {name: f"ar{ar}" for name, ar in methods.items()}, metadata,
                           out / pte)
    step(4)

    write_manifest(out, cfg, name=f"reference-{cfg.name}", tokenizer=tokenizer, programs=(KV_PTE, HYBRID_PTE),
                   lookahead=lookahead, model={"exporter_version": EXPORTER_VERSION})


def write_manifest(out: Path, cfg: LlamaConfig, *, name: str, tokenizer: str, programs: tuple[str, str],
                   lookahead: Mode, model: dict) -> None:
    """The reference bundle's manifest in ``out``: its kv and hybrid ``programs``, the lookahead one
    and the tokenizer, run by the host runner; ``model``: what the manifest's model record says beside
    the config (the exporter's version, the I/O layout)."""
    kv, hybrid = programs
    files = [describe_file(out, out / pte, role="pte") for pte in (kv, hybrid, lookahead.pte)]
    files.append(describe_file(out, out / tokenizer, role="tokenizer"))
    Bundle(
        name=name,
        runner_dialect="host",
        tokenizer=tokenizer,
        files=files,
        modes={"kv": Mode(pte=kv, eval_mode=0, ar_len=1),
               "hybrid": Mode(pte=hybrid, eval_mode=1, ar_len=cfg.prefill_ar_len),
               "lookahead": lookahead},
        decoder_model_version=cfg.decoder_model_version,
        model=cfg.to_dict() | {"head_dim": cfg.head_dim} | model,
    ).write(out / MANIFEST)


def hf_specials(cfg: LlamaConfig) -> tuple[str, ...]:
    """The added tokens of an HF tokenizer.json: SmolVLM's for its family, else Qwen's."""
    return SMOLVLM_SPECIALS if cfg.decoder_model_version == "smolvlm" else QWEN2_SPECIALS


def write_tokenizer(cfg: LlamaConfig, out: Path) -> tuple[str, LlamaConfig]:
    """Train and write the config's tokenizer into ``out``: its file name, and the config with the
    vocabulary it gives (base tokens + special tokens), which sizes the model."""
    tokenizer = TOKENIZER_FILES[cfg.tokenizer_format]
    if cfg.tokenizer_format == "hf":
        n_base = write_hf_tokenizer(out / tokenizer, specials=hf_specials(cfg))
    elif cfg.tokenizer_format == "llama2c":
        n_base = write_sentencepiece_tokenizer(out / SENTENCEPIECE_MODEL, out / tokenizer)
    else:
        ranks = train_ranks()
        write_tiktoken_model(out / tokenizer, ranks)
        n_base = len(ranks)
    from farm.model.tokenizer import load_tokenizer

    tok = load_tokenizer(out / tokenizer)
    partial = tuple(i for i in range(n_base) if not _is_utf8(tok.piece(i))
                    or (cfg.tokenizer_format == "llama2c" and i in LLAMA2C_SPECIALS))
    return tokenizer, replace(cfg, vocab_size=tok.n_words, n_base_tokens=n_base, partial_pieces=partial)


def _is_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def quietly(run: Callable[[], None]) -> None:
    """Run an export step with its dependencies' noise off: torchao's CUDA kernels, deprecations
    inside torch.export do not concern a CPU export; the user's terminal stays for our messages."""
    logging.getLogger("torchao").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run()


def _metadata_methods(cfg: LlamaConfig) -> dict[str, int]:
    # Constant methods in the program, as upstream's llama exports carry them: a runner learns the
    # model's shape from the .pte itself, not from a side file.
    return {"get_max_seq_len": cfg.max_seq_len, "get_vocab_size": cfg.vocab_size,
            "get_n_layers": cfg.n_layers, "get_n_kv_heads": cfg.n_kv_heads,
            "get_head_dim": cfg.head_dim, "get_prefill_ar_len": cfg.prefill_ar_len,
            "get_bos_id": cfg.bos_id, "get_n_base_tokens": cfg.n_base_tokens}


def _lower_ar_lens(weights, ar_lens: list[int], metadata: dict[str, int]):
    """The model at each ar_len, lowered to XNNPACK together: methods ``ar<N>``."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner,
    )
    from executorch.exir import to_edge_transform_and_lower

    from farm.model.llama import StaticLlama

    models = {f"ar{ar}": StaticLlama(weights, ar) for ar in ar_lens}
    exported = {name: torch.export.export(m, m.example_inputs(), strict=False)
                for name, m in models.items()}
    return to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()],
                                       constant_methods=metadata)


def _write_program(lowered, methods: dict[str, str], metadata: dict[str, int], path: Path) -> None:
    """One .pte of the lowered methods, under the method names the runner asks for."""
    from executorch.exir import EdgeProgramManager

    program = EdgeProgramManager({name: lowered.exported_program(src) for name, src in methods.items()},
                                 metadata, lowered.compile_config)
    path.write_bytes(program_bytes(program))


def program_bytes(program) -> bytes:
    """The .pte of a decoder's ``EdgeProgramManager``, its graph inputs not memory-planned: the runner's
    own buffers (the KV caches in the updater's layout, the mask) are read where they are, as a QNN
    runner's shared buffers are, instead of being copied into the program's arena on every step (8 MB
    a step at a context of 4096: a long generation took 10.0 s with the copy, 6.2 s without, the same
    tokens). The runner leaves XNNPACK's read slack after them (farm/runner/io_manager.py)."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    config = ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False))
    return program.to_executorch(config).buffer
