"""The chat templates of qnn_llama_runner v1.0.1: a prompt -> the formatted string -> token ids.

Upstream formats each prompt as a string (``get_formatted_prompt`` in
examples/qualcomm/oss_scripts/llama/qnn_llama_runner.cpp, one case per ``--decoder_model_version``), echoes
that string into outputs.txt, and encodes it with the tokenizer, which turns the special tokens written in
the string (``<|eot_id|>``, ``<|im_start|>``, ...) into their ids, a user's text included; the BOS is a
token added by the encoder for the first prompt only (``n_bos = cur_pos_ == 0``), never echoed text.

Kept apart from the engine (no torch here), so that the host can count a prompt's tokens exactly as the
runner will (the suites build prompts of a given token length with it).
"""

from __future__ import annotations

from collections.abc import Callable

from farm.errors import UsageError
from farm.model.tokenizer import Tokenizer


def _llama2(prompt: str, system: str) -> str:
    return prompt


def _llama3(prompt: str, system: str) -> str:
    head = f"<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>" if system else ""
    return (f"{head}<|start_header_id|>user<|end_header_id|>\n\n{prompt}"
            "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def _gemma3(prompt: str, system: str) -> str:
    # Upstream puts the system prompt after the model's turn marker; kept as it is.
    tail = f"{system}<end_of_turn>\n" if system else ""
    return f"<start_of_turn>user\n{prompt}<end_of_turn>\n<start_of_turn>model\n{tail}"


def _phi4(prompt: str, system: str) -> str:
    head = f"<|system|>{system}<|end|>" if system else ""
    return f"{head}<|user|>{prompt}<|end|><|assistant|>"


def _qwen3(prompt: str, system: str) -> str:
    sys_turn = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"<|im_start|>user\n{prompt}<|im_end|>\n{sys_turn}<|im_start|>assistant"


def _smollm2(prompt: str, system: str) -> str:
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{head}<|im_start|>user\n{prompt}<|im_end|>\n\n"


def _smollm3(prompt: str, system: str) -> str:
    head = f"<|im_start|>system\n{system}\n\n" if system else ""
    return f"{head}<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


# --decoder_model_version -> (formatter, the family's end-of-turn marker added to the tokenizer's EOS):
# qnn_llama_runner.cpp get_formatted_prompt and runner/runner.cpp Runner::load, at v1.0.1.
FAMILIES: dict[str, tuple[Callable[[str, str], str], str | None]] = {
    "llama2": (_llama2, None),
    "llama3": (_llama3, "<|eot_id|>"),
    "gemma3": (_gemma3, "<end_of_turn>"),
    "phi_4_mini": (_phi4, "<|end|>"),
    "qwen2_5": (_llama2, None),  # upstream sends a qwen2_5 prompt as it is
    "qwen3": (_qwen3, "<|im_end|>"),
    "smollm2_135m": (_smollm2, "<|im_end|>"),
    "smollm3": (_smollm3, "<|im_end|>"),
}


def check_version(version: str) -> None:
    if version not in FAMILIES:
        raise UsageError(f"--decoder_model_version: unsupported {version!r} (qnn_llama_runner v1.0.1 "
                         f"knows {', '.join(FAMILIES)})")


def format_prompt(prompt: str, system_prompt: str, version: str) -> str:
    """The string upstream encodes and echoes for one prompt (every turn gets the whole template)."""
    check_version(version)
    return FAMILIES[version][0](prompt, system_prompt)


class PromptTemplate:
    """Formats and encodes prompts per --decoder_model_version, and knows its end-of-sequence ids."""

    def __init__(self, tokenizer: Tokenizer, version: str):
        check_version(version)
        self.tok = tokenizer
        self.version = version
        self.eos_ids = {tokenizer.eos_id}
        marker = FAMILIES[version][1]
        if marker is not None:
            # As upstream: the first id the marker encodes to (its id, where the tokenizer has it).
            self.eos_ids.add(self.encode(marker, bos=False)[0])

    def encode(self, text: str, bos: bool) -> list[int]:
        """Token ids of ``text``, special tokens written in it included, as upstream's tokenizer."""
        return self.tok.encode(text, bos=bos)

    def format(self, prompt: str, system_prompt: str) -> str:
        return format_prompt(prompt, system_prompt, self.version)

    def encode_turn(self, prompt: str, system_prompt: str, first: bool) -> list[int]:
        """The ids one prompt becomes: its formatted string, with the BOS on the first turn only."""
        return self.encode(self.format(prompt, system_prompt), bos=first)

    def piece(self, token_id: int, prev_id: int | None = None) -> bytes:
        """What upstream's ``tokenizer->decode(prev, token)`` writes for one token."""
        return self.tok.piece(token_id, prev_id)
