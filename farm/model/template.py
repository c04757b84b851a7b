"""The chat templates of qnn_llama_runner v1.0.1 and v1.4.1: a prompt -> the formatted string -> token ids.

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
_LLAMA3 = ChatTemplate(
    "{system}<|start_header_id|>user<|end_header_id|>\n\n{prompt}<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    system_turn="<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>",
    end_marker="<|eot_id|>")
# Upstream puts the system prompt after the model's turn marker; kept as it is.
_GEMMA = ChatTemplate("<start_of_turn>user\n{prompt}<end_of_turn>\n<start_of_turn>model\n{system}",
                      system_turn="{system}<end_of_turn>\n", end_marker="<end_of_turn>")
_PHI4 = ChatTemplate("{system}<|user|>{prompt}<|end|><|assistant|>", system_turn="<|system|>{system}<|end|>",
                     end_marker="<|end|>")
# The system turn after the user's, as upstream has it.
_QWEN3 = ChatTemplate(_CHATML_TURN + "{system}<|im_start|>assistant", system_turn=_CHATML_SYSTEM,
                      end_marker="<|im_end|>")
_SMOLLM3 = ChatTemplate("{system}" + _CHATML_TURN + "<|im_start|>assistant\n",
                        system_turn="<|im_start|>system\n{system}\n\n", end_marker="<|im_end|>")

# --decoder_model_version -> its template, per upstream release: qnn_llama_runner.cpp get_formatted_prompt
# (the turns) and runner/runner.cpp Runner::load (the end markers added to the tokenizer's EOS).
# v1.0.1: QLR:99-179 (QLR = qnn_llama_runner.cpp), RUN:121-139 (the versions), RUN:192-205 (the markers).
FAMILIES: dict[str, ChatTemplate] = {
    "llama2": _AS_IT_IS,
    "llama3": _LLAMA3,
    "gemma3": _GEMMA,
    "phi_4_mini": _PHI4,
    "qwen2_5": _AS_IT_IS,
    "qwen3": _QWEN3,
    # v1.0.1 ends the user's turn with a blank line and opens no assistant turn.
    "smollm2_135m": ChatTemplate("{system}" + _CHATML_TURN + "\n", system_turn=_CHATML_SYSTEM,
                                 end_marker="<|im_end|>"),
    "smollm3": _SMOLLM3,
}

# v1.4.1: QLR:103-210, RUN:116-146 (the versions), RUN:194-213 (the markers). Five versions more
# (codegen, gemma, gemma2, granite, glm), and smollm2's prompt opens the assistant's turn.
FAMILIES_V1_4_1: dict[str, ChatTemplate] = {
    "llama2": _AS_IT_IS,
    "llama3": _LLAMA3,
    "gemma": _GEMMA,
    "gemma2": ChatTemplate("<start_of_turn>user\n{prompt}<end_of_turn>\n<start_of_turn>model\n",
                           end_marker="<end_of_turn>"),  # no system turn at all
    "gemma3": _GEMMA,
    # No marker of its own: the tokenizer's EOS (<|end_of_text|>) ends it.
    "granite": ChatTemplate("{system}<|start_of_role|>user<|end_of_role|>{prompt}<|end_of_text|>\n"
                            "<|start_of_role|>assistant<|end_of_role|>",
                            system_turn="<|start_of_role|>system<|end_of_role|>{system}<|end_of_text|>\n"),
    "phi_4_mini": _PHI4,
    "qwen2_5": _AS_IT_IS,
    "qwen3": _QWEN3,
    "smollm2_135m": ChatTemplate("{system}" + _CHATML_TURN + "<|im_start|>assistant\n\n",
                                 system_turn=_CHATML_SYSTEM, end_marker="<|im_end|>"),
    "smollm3": _SMOLLM3,
    "codegen": ChatTemplate("{prompt}", end_marker="<|endoftext|>"),
    # The system turn after the user's; the next user turn's marker ends a reply.
    "glm": ChatTemplate("<|user|>\n{prompt}{system}<|assistant|>\n", system_turn="<|system|>\n{system}",
                        end_marker="<|user|>"),
}

# The upstream releases whose templates the farm knows: a runner of dialect qnn-v1.4 formats as v1.4.1
# does, farm-llama-runner and qnn-v1.0 runners as v1.0.1 does.
V1_0_1, V1_4_1 = "v1.0.1", "v1.4.1"
TEMPLATES: dict[str, dict[str, ChatTemplate]] = {V1_0_1: FAMILIES, V1_4_1: FAMILIES_V1_4_1}


def families(upstream: str = V1_0_1) -> dict[str, ChatTemplate]:
    """The --decoder_model_version values qnn_llama_runner of release ``upstream`` accepts."""
    try:
        return TEMPLATES[upstream]
    except KeyError:
        raise UsageError(f"upstream release {upstream!r}: the farm knows the templates of "
                         f"{', '.join(TEMPLATES)}") from None


# decoder_constants.py v1.4.1's versions that qnn_multimodal_runner runs, not qnn_llama_runner.
MULTIMODAL_VERSIONS = ("granite_speech", "smolvlm", "internvl3")


def check_version(version: str, upstream: str = V1_0_1) -> None:
    known = families(upstream)
    if version not in known:
        hint = ("; it is a version of qnn_multimodal_runner (farm/runner/multimodal.py)"
                if version in MULTIMODAL_VERSIONS else "")
        raise UsageError(f"--decoder_model_version: unsupported {version!r} (qnn_llama_runner {upstream} "
                         f"knows {', '.join(known)}){hint}")


def format_prompt(prompt: str, system_prompt: str, version: str, upstream: str = V1_0_1) -> str:
    """The string upstream encodes and echoes for one prompt (every turn gets the whole template)."""
    check_version(version, upstream)
    return families(upstream)[version].format(prompt, system_prompt)


class PromptTemplate:
    """Formats and encodes prompts per --decoder_model_version, and knows its end-of-sequence ids."""

    def __init__(self, tokenizer: Tokenizer, version: str, upstream: str = V1_0_1):
        check_version(version, upstream)
        self.tok = tokenizer
        self.version = version
        self.upstream = upstream
        self.eos_ids = {tokenizer.eos_id}
        marker = families(upstream)[version].end_marker
        if marker is not None:
            # As upstream: the first id the marker encodes to (its id, where the tokenizer has it).
            self.eos_ids.add(self.encode(marker, bos=False)[0])

    def encode(self, text: str, bos: bool) -> list[int]:
        """Token ids of ``text``, special tokens written in it included, as upstream's tokenizer."""
        return self.tok.encode(text, bos=bos)

    def format(self, prompt: str, system_prompt: str) -> str:
        return format_prompt(prompt, system_prompt, self.version, self.upstream)

    def encode_turn(self, prompt: str, system_prompt: str, first: bool) -> list[int]:
        """The ids one prompt becomes: its formatted string, with the BOS on the first turn only."""
        return self.encode(self.format(prompt, system_prompt), bos=first)

    def piece(self, token_id: int, prev_id: int | None = None) -> bytes:
        """What upstream's ``tokenizer->decode(prev, token)`` writes for one token."""
        return self.tok.piece(token_id, prev_id)


# -- qnn_multimodal_runner v1.4.1 (runner/multimodal_runner/vision_chat_template.h, VCT below) ----------

IMAGE_TOKEN = "<image>"  # VCT:16 IMG_TOKEN: where an image's embeddings go
# VCT:24-40: what wraps each <image> (start, global image, end)
_VISION_WRAP = {"smolvlm": ("<fake_token_around_image>", "<global-img>", "<fake_token_around_image>"),
                "internvl3": ("<img>", "", "</img>")}
# multimodal_runner.cpp:198-203: the end of a turn, beside the tokenizer's EOS
VISION_END_MARKERS = {"smolvlm": "<end_of_utterance>", "internvl3": "<|im_end|>"}
VISION_VERSIONS = tuple(_VISION_WRAP)


def format_vision_prompt(prompt: str, system_prompt: str, version: str) -> str:
    """VCT apply_chat_template (VCT:66-101): the turn around the prompt, each <image> expanded
    (expand_image_tokens, VCT:42-64). An unknown version is upstream's "unsupported Vision-Language
    model version"."""
    if version not in _VISION_WRAP:
        raise UsageError(f"--decoder_model_version: unsupported {version!r} (qnn_multimodal_runner v1.4.1's "
                         f"vision-language models: {', '.join(VISION_VERSIONS)})")
    start, global_img, end = _VISION_WRAP[version]
    expanded = prompt.replace(IMAGE_TOKEN, start + global_img + IMAGE_TOKEN + end)
    if version == "smolvlm":
        system = (f"<|start_header_id|>system<|end_header_id|>\n\n{system_prompt}<|eot_id|>"
                  if system_prompt else "")
        return f"{system}<|im_start|>User:{expanded}<end_of_utterance>\nAssistant:"
    system = f"<|im_start|>system<|im_end|>\n\n{system_prompt}<|im_end|>" if system_prompt else ""
    return f"{system}<|im_start|>user:\n{expanded}<|im_end|>assistant\n"
