"""`farm export --model tiny-smolvlm`: the reference vision-language bundle, as ExecuTorch 1.4.1's
llama.py exports SmolVLM for qnn_multimodal_runner (sources at tag v1.4.1,
examples/qualcomm/oss_scripts/llama/):

- ``vision_encoder_qnn.pte``: method ``forward``, pixels [1, 3, H, W] float32 -> image embeddings
  [1, n_image_tokens, dim] (encoder.h:56 kEncoderForwardName; file name llama.py:707-713). The
  encoder is farm/model/vision.py (SmolVLM's shape; upstream's module imports the QNN backend).
- ``tok_embedding_qnn.pte``: the wheel's TokenEmbedding (model/embedding.py) over the decoder's
  embedding table, methods ``tok_embedding_kv_forward`` (ar_len 1) and ``tok_embedding_prefill_forward``
  (the prefill's ar_len), tokens [1, AR] int32 -> [1, AR, dim] (multimodal_runner.cpp:162-183).
- ``kv_llama_qnn.pte`` / ``hybrid_llama_qnn.pte``: the text decoder, the wheel's
  LlamaModelWithoutEmbedding (static_llama.py): input embeddings [1, AR, dim] in place of tokens,
  otherwise 1.4.1's layout and metadata (farm/bundle/export_v14.py).
- ``tokenizer.json`` with SmolVLM's added tokens, two seeded test images (``image_<name>.raw``, raw
  float32 as load_image reads them, utils.h) each with its input list (``--image_path``), and
  ``goldens.json``: the tokens the float model generates for the suites' prompt on each image, computed
  here in eager PyTorch (encoder, embeddings and decoder with full causal attention, no cache), a path
  that shares nothing with the runner's KV cache or its embedding merger.

Lowered to XNNPACK, cached by content like every reference bundle.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from farm.bundle import export as reference  # the cache, publishing and tokenizers every reference shares
from farm.bundle import export_v14
from farm.bundle.manifest import Bundle, Mode, Multimodal, describe_file
from farm.errors import UsageError
from farm.model.config import VLM_CONFIGS, LlamaConfig, VisionConfig

EXPORTER_VERSION = "4"  # 2: goldens carry their text; 3: the encoder seeded whole (its biases were not); 4: the decoder's inputs in place
ENCODER_PTE = "vision_encoder_qnn.pte"
TOK_EMBEDDING_PTE = "tok_embedding_qnn.pte"
KV_PTE, HYBRID_PTE = export_v14.KV_PTE, export_v14.HYBRID_PTE
TOK_EMBEDDING_METHODS = {"tok_embedding_kv_forward": "kv", "tok_embedding_prefill_forward": "prefill"}
GOLDENS = "goldens.json"
IMAGES = {"gradient": 11, "pattern": 12}  # test image name -> its seed (farm/model/vision.py test_image)
GOLDEN_PROMPT = "<image>Can you describe this image?"  # the suites' prompt (image placeholder first)
GOLDEN_SEQ_LEN = 96



def image_file(name: str) -> str:
    return f"image_{name}.raw"


def input_list_file(name: str) -> str:
    return f"image_{name}_input_list.txt"


def _resolve(name: str) -> tuple[LlamaConfig, VisionConfig]:
    if name not in VLM_CONFIGS:
        raise UsageError(f"--model: unknown vision-language reference {name!r} (known: {', '.join(VLM_CONFIGS)})")
    return VLM_CONFIGS[name]


def bundle_dir(name: str, out_dir: str | os.PathLike | None = None) -> Path:
    cfg, vision = _resolve(name)
    root = Path(out_dir) if out_dir else reference.default_cache_dir()
    key = reference.cache_key(cfg, {"name": "v1.4-multimodal", "exporter": EXPORTER_VERSION,
                          "vision": vision.to_dict(), "prompt": GOLDEN_PROMPT, "seq_len": GOLDEN_SEQ_LEN})
    return root / f"reference-{cfg.name}-{key}"


def export_bundle(name: str = "tiny-smolvlm", out_dir: str | os.PathLike | None = None, *,
                  on_step: reference.StepCallback | None = None) -> Path:
    cfg, vision = _resolve(name)
    step = on_step or (lambda what, n, steps: None)
    steps = reference.STEPS
    return reference.publish(bundle_dir(name, out_dir), lambda staging: reference.quietly(
        lambda: _export(cfg, vision, staging, lambda n: step(steps[n - 1], n, len(steps)))))


def _export(cfg: LlamaConfig, vision_cfg: VisionConfig, out: Path, step: Callable[[int], None]) -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from farm.model import upstream_llama
    from farm.model.llama import LlamaWeights
    from farm.model.vision import VisionEncoder, test_image

    step(1)
    tokenizer, cfg = reference.write_tokenizer(cfg, out)
    weights = LlamaWeights(cfg).eval()
    encoder = VisionEncoder(vision_cfg, cfg.dim).eval()
    ar_lens = {"kv": 1, "prefill": cfg.prefill_ar_len}
    with torch.no_grad():
        step(2)
        decoders = {ar: upstream_llama.decoder_of_embeddings(weights, ar) for ar in ar_lens.values()}
        lowered = to_edge_transform_and_lower(
            {f"ar{ar}": torch.export.export(m, upstream_llama.export_inputs(m), strict=False)
             for ar, m in decoders.items()}, partitioner=[XnnpackPartitioner()])
        TokenEmbedding = upstream_llama.token_embedding_module().TokenEmbedding
        embeddings = {}
        for method, which in TOK_EMBEDDING_METHODS.items():
            module = TokenEmbedding(decoders[1].tok_embeddings, 1, ar_lens[which], cfg.vocab_size, cfg.dim,
                                    use_i64_token=False).eval()
            embeddings[method] = torch.export.export(module, module.get_example_input(), strict=False)
        tok_embedding = to_edge_transform_and_lower(embeddings, partitioner=[XnnpackPartitioner()])
        vision = to_edge_transform_and_lower(
            {"forward": torch.export.export(encoder, encoder.example_inputs(), strict=False)},
            partitioner=[XnnpackPartitioner()])
        step(3)
        meta = export_v14.metadata(decoders[1])
        export_v14.write_program(lowered, {"kv_forward": "ar1"}, meta, out / KV_PTE)
        export_v14.write_program(lowered, {"kv_forward": "ar1", "prefill_forward": f"ar{cfg.prefill_ar_len}"},
                                  meta, out / HYBRID_PTE)
        (out / TOK_EMBEDDING_PTE).write_bytes(tok_embedding.to_executorch().buffer)
        (out / ENCODER_PTE).write_bytes(vision.to_executorch().buffer)
        goldens = []
        for name, seed in IMAGES.items():
            image = test_image(vision_cfg, seed)
            (out / image_file(name)).write_bytes(image.numpy().astype("<f4").tobytes())
            (out / input_list_file(name)).write_text(image_file(name) + "\n", encoding="utf-8")
            ids = golden_tokens(weights, encoder, tokenizer_path=out / tokenizer, image=image,
                                prompt=GOLDEN_PROMPT, seq_len=GOLDEN_SEQ_LEN)
            goldens.append({"input": name, "prompt": GOLDEN_PROMPT, "seq_len": GOLDEN_SEQ_LEN,
                            "generated_ids": ids, "text": golden_text(out / tokenizer, ids)})
        (out / GOLDENS).write_text(json.dumps({"goldens": goldens}, indent=1) + "\n", encoding="utf-8")
    step(4)
    files = [describe_file(out, out / f, role="pte") for f in (KV_PTE, HYBRID_PTE, ENCODER_PTE, TOK_EMBEDDING_PTE)]
    files.append(describe_file(out, out / tokenizer, role="tokenizer"))
    for name in IMAGES:
        files += [describe_file(out, out / image_file(name), role="other"),
                  describe_file(out, out / input_list_file(name), role="other")]
    # The goldens stay on the host: a manifest file is pushed to every device, the goldens are read
    # by the suites.
    Bundle(name=f"reference-{cfg.name}", runner_dialect="host", tokenizer=tokenizer, files=files,
           modes={"kv": Mode(pte=KV_PTE, eval_mode=0, ar_len=1),
                  "hybrid": Mode(pte=HYBRID_PTE, eval_mode=1, ar_len=cfg.prefill_ar_len)},
           decoder_model_version=cfg.decoder_model_version,
           model=cfg.to_dict() | {"head_dim": cfg.head_dim, "io_layout": export_v14.LAYOUT,
                                  "exporter_version": EXPORTER_VERSION, "vision": vision_cfg.to_dict(),
                                  "goldens": GOLDENS},
           multimodal=Multimodal(modality="vision", encoder=ENCODER_PTE, tok_embedding=TOK_EMBEDDING_PTE,
                                 inputs={name: input_list_file(name) for name in IMAGES}),
           ).write(out / reference.MANIFEST)


def golden_text(tokenizer_path: Path, ids: list[int]) -> str:
    """What the runner writes after the echo for ``ids``: each piece decoded after the one before it
    (the first after itself, multimodal_runner.cpp:528-531). UTF-8: the reference writes no partial
    byte (LlamaConfig.partial_pieces)."""
    from farm.model.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_path)
    return b"".join(tok.piece(t, p) for p, t in zip([ids[0], *ids[:-1]], ids)).decode("utf-8")


def golden_tokens(weights, encoder, *, tokenizer_path: Path, image, prompt: str, seq_len: int) -> list[int]:
    """The float model's greedy tokens for ``prompt`` (one ``<image>``) on ``image``, as the runner
    should generate them: the formatted prompt's text embedded by the decoder's table and the image's
    embeddings in place of its ``<image>``, then full causal attention over the whole sequence at every
    step (farm.model.llama.eager_logits_of_embeddings)."""
    import torch

    from farm.model.llama import eager_logits_of_embeddings
    from farm.model.template import IMAGE_TOKEN, format_vision_prompt
    from farm.model.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_path)
    before, after = format_vision_prompt(prompt, "", weights.cfg.decoder_model_version).split(IMAGE_TOKEN, 1)
    with torch.no_grad():
        parts = [weights.embed(torch.tensor(tok.encode(before, bos=False))), encoder(image)[0],
                 weights.embed(torch.tensor(tok.encode(after, bos=False)))]
        x = torch.cat(parts)
        generated = []
        # The runner writes seq_len - n_prompt tokens: the prefill's one, then the loop's until the
        # position reaches seq_len - 1 (token_generator.cpp).
        n_prompt = x.shape[0]
        while len(generated) < seq_len - n_prompt:
            token = int(eager_logits_of_embeddings(weights, x)[-1].argmax())
            generated.append(token)
            x = torch.cat([x, weights.embed(torch.tensor([token]))])
    return generated
