"""qnn_multimodal_runner v1.4.1 on the host: a vision-language model's run, observably as upstream's.

Shown when the runner's argv starts with ``--ptefarm_upstream=multimodal-v1.4.1`` (farm/runner/releases.py
``MULTIMODAL_V1_4_1``: its flags and --help, QMR:43-125). Sources at tag v1.4.1, examples/qualcomm/oss_scripts/llama/:
QMR = qnn_multimodal_runner.cpp, MMR = runner/multimodal_runner/multimodal_runner.cpp, CT =
runner/multimodal_runner/chat_template.h, UT = runner/multimodal_runner/utils.h.

One run (QMR:140-258): the encoder (``forward``), the token embedding (``tok_embedding_kv_forward``,
``tok_embedding_prefill_forward``) and the text decoder (``kv_forward``, ``prefill_forward``: input
embeddings [1, AR, dim] in place of tokens, otherwise 1.4.1's layout, farm/runner/io_v14.py) are
loaded; ``--image_path`` names an input list (UT load_raw_files: file names split on spaces, one or
more per line) whose files are raw float32 pixels of exactly the encoder's input size (UT load_image).
Each prompt gets as many ``<image>`` as there are images when it has none (CT prepare_messages), is
formatted (farm.model.template.format_vision_prompt) and cut at each ``<image>`` (CT dispatch_inputs);
the text parts are embedded without a BOS, each image encoded, and the rows, merged in that order, are
the prompt the decoder prefills (MMR:456-522). The echo is the text parts alone; the token generator
and the stats are qnn_llama_runner v1.4.1's (PyTorchObserver line, inference_speed.txt, MMR:47-71).
EOS: the tokenizer's and the model's end of turn (MMR:184-209).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from farm.errors import UsageError
from farm.model.template import IMAGE_TOKEN, VISION_END_MARKERS, VISION_VERSIONS, format_vision_prompt
from farm.runner.engine import Generation, LlamaRunner, load_program, pick
from farm.runner.io_manager import padded
from farm.runner.io_v14 import SmartMaskV14

ENCODER_METHOD = "forward"  # encoder.h:56 kEncoderForwardName
# MMR:162-183: (the prompt's embedding method, the generator's) per eval_mode
TOK_EMBEDDING_METHODS = {0: ("tok_embedding_kv_forward", "tok_embedding_kv_forward"),
                         1: ("tok_embedding_prefill_forward", "tok_embedding_kv_forward")}
MULTIMODAL_VERSIONS = (*VISION_VERSIONS, "granite_speech")  # MMR:134-142


class VisionTemplate:
    """PromptTemplate's surface for a vision-language model: its end ids, pieces, the formatted turn."""

    def __init__(self, tokenizer, version: str):
        self.tok = tokenizer
        self.version = version
        self.eos_ids = {tokenizer.eos_id, tokenizer.encode(VISION_END_MARKERS[version], bos=False)[0]}

    def encode(self, text: str, bos: bool) -> list[int]:
        return self.tok.encode(text, bos=bos)

    def format(self, prompt: str, system_prompt: str) -> str:
        return format_vision_prompt(prompt, system_prompt, self.version)

    def piece(self, token_id: int, prev_id: int | None = None) -> bytes:
        return self.tok.piece(token_id, prev_id)


class MultimodalRunner(LlamaRunner):
    """The text decoder of embeddings, with the encoder and the token embedding beside it."""

    def __init__(self, decoder_path: str, encoder_path: str, tok_embedding_path: str, tokenizer_path: str,
                 eval_mode: int, decoder_model_version: str, dump_logits: bool = False):
        if decoder_model_version not in MULTIMODAL_VERSIONS:
            raise UsageError(f"--decoder_model_version: Unsupported Decoder Model {decoder_model_version!r} "
                             f"(qnn_multimodal_runner v1.4.1 runs {', '.join(MULTIMODAL_VERSIONS)})")
        if decoder_model_version not in VISION_VERSIONS:
            raise UsageError(f"--decoder_model_version: {decoder_model_version!r} is an audio-language "
                             "model; the farm's multimodal runner runs vision-language models only")
        if eval_mode not in TOK_EMBEDDING_METHODS:
            raise UsageError(f"--eval_mode: {eval_mode} is not supported by the farm's multimodal runner "
                             "(0: kv, 1: hybrid)")
        super().__init__(decoder_path, tokenizer_path, eval_mode, SmartMaskV14, dump_logits=dump_logits,
                         kv_method="kv_forward", flag="--decoder_path",
                         make_template=lambda tok: VisionTemplate(tok, decoder_model_version))
        if not self.v14:
            raise UsageError(f"--decoder_path: {decoder_path} is not a decoder in 1.4.1's layout")
        self.encoder = load_program(encoder_path, "--encoder_path").load_method(ENCODER_METHOD)
        program = load_program(tok_embedding_path, "--tok_embedding_path")
        names = set(program.method_names)
        prompt_method, token_method = TOK_EMBEDDING_METHODS[eval_mode]
        for name in (prompt_method, token_method):
            if name not in names:
                raise UsageError(f"--tok_embedding_path: {tok_embedding_path} has no method {name!r} "
                                 f"(it has: {', '.join(sorted(names))})")
        self.embed_prompt = program.load_method(prompt_method)
        self.embed_token = program.load_method(token_method)
        self.dim = self.embed_token.metadata.output_tensor_meta(0).sizes()[2]
        self.encoder_ms = 0.0  # the last generate call's encoder time (host wall clock)

    def image_size(self) -> list[int]:
        """The encoder's input size (QMR:213-219), which every image file must match."""
        return list(self.encoder.metadata.input_tensor_meta(0).sizes())

    def _embed(self, method, ids: list[int]) -> np.ndarray:
        """Rows [len(ids), dim] from a token embedding method, in chunks of its ar_len."""
        ar = method.metadata.input_tensor_meta(0).sizes()[1]
        rows = []
        for start in range(0, len(ids), ar):
            chunk = ids[start : start + ar]
            tokens = torch.zeros(1, ar, dtype=torch.int32)
            tokens[0, : len(chunk)] = torch.tensor(chunk, dtype=torch.int32)
            rows.append(method.execute([tokens])[0].numpy()[0, : len(chunk)].copy())
        return np.concatenate(rows) if rows else np.zeros((0, self.dim), np.float32)

    def _encode(self, pixels: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        out = self.encoder.execute([torch.from_numpy(pixels).reshape(self.image_size())])[0].numpy()
        self.encoder_ms += (time.perf_counter() - start) * 1000.0
        return out.reshape(-1, self.dim).copy()

    def _step_rows(self, method, rows: np.ndarray, keep: list[np.ndarray] | None) -> np.ndarray:
        """_step with input embeddings: the io manager's inputs for len(rows) entries, rows in input 0."""
        ar = self.io.ar_len
        inputs = self.io.inputs([0] * len(rows), self.io.n_past)
        hidden = padded((1, ar, self.dim))  # read in place by the decoder (io_manager.padded)
        hidden[0, : len(rows)] = torch.from_numpy(rows)
        outputs = method.execute([hidden, *inputs[1:]])
        if keep is not None:
            keep.append(outputs[0].numpy()[0].copy())
        self.io.update(outputs, len(rows))
        return outputs[0].numpy()[0, len(rows) - 1]

    def _step(self, method, tokens: list[int], keep: list[np.ndarray] | None = None) -> np.ndarray:
        return self._step_rows(method, self._embed(self.embed_token, tokens), keep)

    def generate_parts(self, parts: list[str | np.ndarray], seq_len: int, temperature: float,
                       gen: torch.Generator) -> Generation:
        """One message (MMR:417-574): ``parts`` are the dispatched inputs, text or an image's pixels."""
        from dataclasses import replace

        context = self.context_len
        seq_len = context if seq_len > context or seq_len <= 0 else seq_len  # MMR:429-445
        stats, clock = self.stats, self.clock
        stats.inference_start_ms = clock.now_ms()
        self.encoder_ms = 0.0
        echo, ids, rows = "", [], []
        for part in parts:
            if isinstance(part, str):
                echo += part
                part_ids = self.template.encode(part, bos=False)  # MMR:446-463: no BOS
                ids += part_ids
                rows.append(self._embed(self.embed_prompt, part_ids))
            else:
                rows.append(self._encode(part))
        merged = np.concatenate(rows) if rows else np.zeros((0, self.dim), np.float32)
        n_prompt = len(merged)
        if n_prompt < 1:
            raise UsageError("--prompt: Expected at least 1 prompt token")
        if self.cur_pos + n_prompt >= seq_len:
            raise UsageError(f"--seq_len: sequence length exceeded - please increase the seq_len value "
                             f"({self.cur_pos} before this prompt, {n_prompt} rows in it, --seq_len {seq_len})")
        if self.cur_pos + n_prompt > self.max_prompt_len():
            raise UsageError(f"--prompt: {n_prompt} prompt rows at position {self.cur_pos} exceed what the "
                             f"prompt processor can hold ({self.max_prompt_len()})")
        start_pos = self.cur_pos
        text = bytearray(echo.encode("utf-8", "surrogateescape"))
        self.io.switch_method(self.prefill_ar)
        logits = None
        for start in range(0, n_prompt, self.prefill_ar):
            logits = self._step_rows(self.prefill, merged[start : start + self.prefill_ar], self.prefill_logits)
        token = pick(logits, temperature, gen)
        clock.prefill(n_prompt)
        stats.first_token_ms = stats.prompt_eval_end_ms = clock.now_ms()
        generated = [token]
        text += self.template.piece(token, token)
        self.io.switch_method(self.decode_ar)
        reached_eos = self.decode_loop(token, seq_len, temperature, gen, generated, text)
        stats.inference_end_ms = clock.now_ms()
        stats.prompt_tokens = n_prompt
        stats.generated_tokens = self.cur_pos - start_pos - n_prompt
        return Generation(prompt_ids=ids, generated_ids=generated, text=bytes(text), stats=replace(stats),
                          reached_eos=reached_eos, newlines=int(reached_eos))


def require_input_list(path: str, modality: str) -> None:
    """QMR:191-199: a vision-language model's run needs --image_path (an audio one's --audio_path)."""
    if not path:
        if modality == "vision":
            raise UsageError("--image_path: For VLM, please specify image path.")
        raise UsageError("--audio_path: For ALM, please specify audio path.")


def load_input_list(path: str, flag: str) -> list[str]:
    """UT load_raw_files: every line's space-separated names, blank lines and a trailing CR dropped."""
    try:
        text = open(path, "rb").read().decode("utf-8", "surrogateescape")
    except OSError as e:
        raise UsageError(f"--{flag}: Failed to open input list file: {path} ({e.strerror})") from None
    files = []
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if line:
            files += line.split(" ")
    return files


def load_image(path: str, size: list[int]) -> np.ndarray:
    """UT load_image: the file holds exactly the encoder input's float32 elements."""
    expected = int(np.prod(size)) * 4
    try:
        raw = open(path, "rb").read()
    except OSError as e:
        raise UsageError(f"--image_path: Failed to open input file: {path} ({e.strerror})") from None
    if len(raw) != expected:
        raise UsageError(f"--image_path: Input image size mismatch. file bytes: {len(raw)}, expected bytes: "
                         f"{expected} (file: {path})")
    return np.frombuffer(raw, dtype="<f4").reshape(size).copy()


def prepare_messages(prompts: list[str], images: list[str]) -> list[tuple[str, list[str]]]:
    """CT prepare_messages for images: <image> prepended to the first prompt when no prompt has one;
    the placeholders must then be as many as the images, and each prompt takes the next images."""
    prompts = list(prompts)
    count = sum(p.count(IMAGE_TOKEN) for p in prompts)
    if count == 0 and images:
        prompts[0] = IMAGE_TOKEN * len(images) + prompts[0]
        count = len(images)
    if count != len(images):
        raise UsageError(f"--image_path: Number of {IMAGE_TOKEN} tokens ({count}) does not match number of "
                         f"images ({len(images)}). Please check your prompts and image paths.")
    messages, taken = [], 0
    for prompt in prompts:
        n = prompt.count(IMAGE_TOKEN)
        messages.append((prompt, images[taken : taken + n]))
        taken += n
    return messages


def dispatch(formatted: str, images: list[np.ndarray]) -> list[str | np.ndarray]:
    """CT dispatch_inputs: the formatted prompt cut at each <image>, that image's pixels in its place."""
    parts: list[str | np.ndarray] = []
    pos = 0
    for image in images:
        at = formatted.find(IMAGE_TOKEN, pos)
        if at < 0:
            break
        if at > pos:
            parts.append(formatted[pos:at])
        parts.append(image)
        pos = at + len(IMAGE_TOKEN)
    if pos < len(formatted):
        parts.append(formatted[pos:])
    return parts


def run(args, prompts: list[str], release, write) -> int:
    """QMR main and start_multimodal_runner, after cli.run parsed the flags: ``write(path, bytes, flag)``
    writes an output file atomically."""
    from farm.runner.engine import cpp_double
    from farm.runner.timing import simulated_phone

    if args.tokenized_prompt:
        raise UsageError("--tokenized_prompt: qnn_multimodal_runner v1.4.1 does not run tokenized prompts "
                         "(QMR:197-198: a TODO upstream)")
    runner = MultimodalRunner(args.decoder_path, args.encoder_path, args.tok_embedding_path,
                              args.tokenizer_path, args.eval_mode, args.decoder_model_version,
                              dump_logits=bool(args.dump_logits_path))
    require_input_list(args.image_path, "vision")
    size = runner.image_size()
    names = load_input_list(args.image_path, "image_path")
    messages = prepare_messages(prompts, names)
    # Read by the simulated phone's clock (farm/runner/timing.py) as of qnn_llama_runner's runs.
    args.model_path, args.kv_updater = args.decoder_path, release.updaters[0]
    gen = torch.Generator().manual_seed(0)
    text = bytearray()
    for _ in range(args.num_iters):
        for prompt, files in messages:
            formatted = runner.template.format(prompt, args.system_prompt)
            parts = dispatch(formatted, [load_image(f, size) for f in files])
            with simulated_phone(runner, args):
                result = runner.generate_parts(parts, args.seq_len, args.temperature, gen)
            text += result.text
            sys.stdout.write("\n")  # the v1.4.1 token generator's newline at the end of each generation
            print(result.stats.observer_line(rates=release.observer_rates), flush=True)
            # Ours, on stderr as upstream's ET_LOG lines go: the encoder's share of the prompt's time,
            # which PyTorchObserver does not separate (measured on the host, whatever the clock).
            print(f"ptefarm: encoder {runner.encoder_ms:.3f} ms (host) for {len(files)} image(s)",
                  file=sys.stderr)
            write(args.performance_output_path, cpp_double(result.stats.tokens_per_second()).encode(),
                  "performance_output_path")
            if args.dump_logits_path:
                write(args.dump_logits_path, runner.logits_dump(), "dump_logits_path")
    write(args.output_path, bytes(text), "output_path")
    return 0
