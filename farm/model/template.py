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

from dataclasses import dataclass

from farm.errors import UsageError
from farm.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class ChatTemplate:
    """One family's template, as upstream writes it: ``turns`` with the user's prompt at ``{prompt}``
    and the system turn at ``{system}`` (``system_turn`` with the system prompt at its ``{system}``;
    nothing when the system prompt is empty, or where the family has no system turn). ``end_marker``:
    the family's end-of-turn marker, added to the tokenizer's EOS (None: the EOS alone)."""

    turns: str
    system_turn: str = ""
    end_marker: str | None = None

    def format(self, prompt: str, system: str) -> str:
        # str.format fills the template's own fields: braces in the prompts are text, never fields.
        system_turn = self.system_turn.format(system=system) if system else ""
        return self.turns.format(prompt=prompt, system=system_turn)


_AS_IT_IS = ChatTemplate("{prompt}")  # llama2's, and qwen2_5's: upstream sends the prompt as it is
_CHATML_TURN = "<|im_start|>user\n{prompt}<|im_end|>\n"  # qwen3's and the smollms'
_CHATML_SYSTEM = "<|im_start|>system\n{system}<|im_end|>\n"

# --decoder_model_version -> its template: qnn_llama_runner.cpp get_formatted_prompt (the turns) and
# runner/runner.cpp Runner::load (the end markers), at v1.0.1.
FAMILIES: dict[str, ChatTemplate] = {
    "llama2": _AS_IT_IS,
    "llama3": ChatTemplate(
        "{system}<|start_header_id|>user<|end_header_id|>\n\n{prompt}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        system_turn="<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>",
        end_marker="<|eot_id|>"),
    # Upstream puts the system prompt after the model's turn marker; kept as it is.
    "gemma3": ChatTemplate("<start_of_turn>user\n{prompt}<end_of_turn>\n<start_of_turn>model\n{system}",
                           system_turn="{system}<end_of_turn>\n", end_marker="<end_of_turn>"),
    "phi_4_mini": ChatTemplate("{system}<|user|>{prompt}<|end|><|assistant|>",
                               system_turn="<|system|>{system}<|end|>", end_marker="<|end|>"),
    "qwen2_5": _AS_IT_IS,
    # The system turn after the user's, as upstream has it.
    "qwen3": ChatTemplate(_CHATML_TURN + "{system}<|im_start|>assistant",
                          system_turn=_CHATML_SYSTEM, end_marker="<|im_end|>"),
    "smollm2_135m": ChatTemplate("{system}" + _CHATML_TURN + "\n", system_turn=_CHATML_SYSTEM,
                                 end_marker="<|im_end|>"),
    "smollm3": ChatTemplate("{system}" + _CHATML_TURN + "<|im_start|>assistant\n",
                            system_turn="<|im_start|>system\n{system}\n\n", end_marker="<|im_end|>"),
}


def check_version(version: str) -> None:
    if version not in FAMILIES:
        raise UsageError(f"--decoder_model_version: unsupported {version!r} (qnn_llama_runner v1.0.1 "
                         f"knows {', '.join(FAMILIES)})")


def format_prompt(prompt: str, system_prompt: str, version: str) -> str:
    """The string upstream encodes and echoes for one prompt (every turn gets the whole template)."""
    check_version(version)
    return FAMILIES[version].format(prompt, system_prompt)


class PromptTemplate:
    """Formats and encodes prompts per --decoder_model_version, and knows its end-of-sequence ids."""

    def __init__(self, tokenizer: Tokenizer, version: str):
        check_version(version)
        self.tok = tokenizer
        self.version = version
        self.eos_ids = {tokenizer.eos_id}
        marker = FAMILIES[version].end_marker
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
