"""Helpers shared by the runner tests: prompts of an exact token length, in-process generation."""

from __future__ import annotations

from pathlib import Path

from farm.bundle import manifest as bundle_mod
from farm.model import template as template_mod
from farm.runner.engine import LlamaRunner
from farm.runner.io_manager import UPDATERS

TEXT = ("Once upon a time, there was a little girl named Lily who loved to play outside in the sun. "
        "One day she found a big red ball in the park, and she ran to it as fast as she could. ") * 4


def paths(manifest: Path, mode: str) -> tuple[str, str]:
    b = bundle_mod.load(manifest)
    by_name = {f.name: f.path for f in b.files}
    return str(by_name[b.modes[mode].pte]), str(by_name[b.tokenizer])


def make_runner(manifest: Path, mode: str, updater: str | type, version: str = "llama2") -> LlamaRunner:
    pte, tok = paths(manifest, mode)
    cls = UPDATERS[updater] if isinstance(updater, str) else updater
    return LlamaRunner(pte, tok, 0 if mode == "kv" else 1, cls, version)


def prompt_of_length(runner: LlamaRunner, n_tokens: int) -> str:
    """A prefix of TEXT that encodes (llama2 style: BOS + text) to exactly n_tokens."""
    if n_tokens == 1:
        return ""
    for end in range(1, len(TEXT)):
        ids = runner.template.encode_turn(TEXT[:end], "", first=True)
        if len(ids) == n_tokens:
            return TEXT[:end]
        if len(ids) > n_tokens:
            break
    raise AssertionError(f"no prefix of TEXT encodes to {n_tokens} tokens")


def greedy(runner: LlamaRunner, prompt: str, seq_len: int) -> tuple[list[int], list[int]]:
    gen = runner.complete(prompt, seq_len)
    return gen.prompt_ids, gen.generated_ids


def end_on(monkeypatch, token: int) -> None:
    """Every prompt template made from now on also ends generation on ``token``: a run that reaches
    an end token where the test chooses."""
    init = template_mod.PromptTemplate.__init__

    def with_end_token(self, tokenizer, version, *args):
        init(self, tokenizer, version, *args)
        self.eos_ids.add(token)

    monkeypatch.setattr(template_mod.PromptTemplate, "__init__", with_end_token)
