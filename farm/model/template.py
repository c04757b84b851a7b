"""The chat template of qnn_llama_runner: prompts -> token ids per --decoder_model_version.

Kept apart from the engine (no torch here), so that the host can count a prompt's tokens exactly as the
runner will (the suites build prompts of a given token length with it).
"""

from __future__ import annotations

from farm.errors import UsageError


class PromptTemplate:
    """Turns prompts into token ids per --decoder_model_version (chat template and end tokens)."""

    def __init__(self, tokenizer, version: str):
        self.tok = tokenizer
        self.version = version
        specials = tokenizer.special_tokens
        if version == "llama3":
            self.eos_ids = {specials["<|eot_id|>"], specials["<|end_of_text|>"]}
        elif version == "llama2":
            self.eos_ids = {tokenizer.eos_id}
        else:
            raise UsageError(f"--decoder_model_version: unsupported {version!r} "
                             "(this runner knows llama2 and llama3)")

    def encode_turn(self, prompt: str, system_prompt: str, first: bool) -> list[int]:
        enc = self.tok.encode
        if self.version == "llama2":
            return enc(prompt, bos=first, eos=False)

        def marker(text: str) -> list[int]:
            return enc(text, bos=False, eos=False, allowed_special="all")

        def user_text(text: str) -> list[int]:
            # A prompt that contains "<|eot_id|>" is text, never a marker.
            return enc(text, bos=False, eos=False) if text else []

        ids = [self.tok.bos_id] if first else []
        if first and system_prompt:
            ids += marker("<|start_header_id|>system<|end_header_id|>\n\n")
            ids += user_text(system_prompt) + marker("<|eot_id|>")
        ids += marker("<|start_header_id|>user<|end_header_id|>\n\n") + user_text(prompt)
        ids += marker("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
        return ids

    def piece(self, token_id: int) -> bytes:
        return self.tok.model.decode_single_token_bytes(token_id)
