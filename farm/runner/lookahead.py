"""Lookahead decoding (``--eval_mode 2``), as qnn_llama_runner v1.0.1's LhdTokenGenerator does it.

runner/lhd_token_generator.cpp (LHD below) runs the decode method ``kv_forward`` with one step of
ar_len >= (window + gcap) * (ngram - 1) rows, exported that way (llama.py: ``ar_len =
next_power_of_two((window + gcap) * (ngram - 1))`` for ``--model_mode lookahead``; prefill_forward as in
hybrid mode). The rows of one step:

- the lookahead branch: ngram - 1 levels of ``window`` guessed tokens. Level 0 is the current token and
  ``window - 1`` guesses at positions pos..pos+window-1, a causal chain; the token of level i, column j
  sits at pos+i+j and sees its column's levels below it (attention map, LHD:40-64);
- the verification branch: up to gcap n-grams from the pool that begin with the current token, each
  ngram - 1 rows at pos+1.. that see row 0 and their own n-gram.

The current token's row is sampled first; then, while a verification n-gram's next token equals what
was just sampled, its row is sampled too (LHD:295-366): every token written is a sample of the model's
logits at a prefix of accepted tokens, so at temperature 0 the tokens are the greedy ones of hybrid
mode, only fewer steps make them. The K/V entries kept are the rows sampled (``selected``, LHD:375),
the last level's samples become new guesses (LHD:164-180) and finished columns enter the n-gram pool
(LHD:110-161). The lookahead branch is seeded once per runner with random prompt tokens (LHD:67-82:
upstream's unseeded ``rand()``; here a generator seeded by ``--seed``; guesses change speed, never the
tokens at temperature 0).

Upstream's quirks kept: EOS prints two newlines (LHD:340 and 385); a step that leaves pos past
context_len - ar_len ends generation with one newline, its entries not cached (LHD:368-372);
generation may run past --seq_len by up to ngram - 1 tokens, as the loop only checks it per step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch

from farm.errors import UsageError


def next_power_of_two(n: int) -> int:
    """llama.py's next_power_of_two: the ar_len upstream exports a lookahead decode method with."""
    return 1 if n <= 0 else 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class LookaheadConfig:
    ngram: int
    window: int
    gcap: int

    @property
    def rows(self) -> int:
        """Rows a step uses: (window + gcap) * (ngram - 1); the method's ar_len may be larger."""
        return (self.window + self.gcap) * (self.ngram - 1)

    def check(self, ar_len: int, model_path: str) -> None:
        # Upstream runs these unchecked: ngram < 2 never advances, gcap 0 divides by zero (LHD:158).
        for flag, value, least in (("ngram", self.ngram, 2), ("window", self.window, 1),
                                   ("gcap", self.gcap, 1)):
            if value < least:
                raise UsageError(f"--{flag}: lookahead decoding (--eval_mode 2) needs --{flag} of at "
                                 f"least {least}, got {value}")
        if self.rows > ar_len:
            raise UsageError(f"--model_path: {model_path}: method 'kv_forward' has ar_len {ar_len}, "
                             f"lookahead with --window {self.window} --gcap {self.gcap} --ngram "
                             f"{self.ngram} needs (window + gcap) * (ngram - 1) = {self.rows} rows; "
                             f"export it with ar_len {next_power_of_two(self.rows)}")

    def attention_map(self) -> list[int]:
        """Each row's parent row (-1: none), LHD:40-64; a row sees its parent's row and itself."""
        n, w = self.ngram, self.window
        parents = [i - 1 for i in range(w)]
        parents += [(i - 1) * w + j for i in range(1, n - 1) for j in range(w)]
        for g in range(self.gcap):
            parents += [0 if j == 0 else (w + g) * (n - 1) + j - 1 for j in range(n - 1)]
        return parents

    def block(self, ar_len: int, masked: float) -> torch.Tensor:
        """The mask among a step's own rows ([ar_len, ar_len], 0 = attend): the attention map's
        ancestry; rows past the map (the method's padding) see only themselves."""
        sees = np.zeros((ar_len, ar_len), dtype=bool)
        np.fill_diagonal(sees, True)
        for i, parent in enumerate(self.attention_map()):
            if parent >= 0:  # a parent comes before its child: its row is complete
                sees[i, :i] = sees[parent, :i]
        return torch.from_numpy(np.where(sees, 0.0, masked).astype(np.float32))


@dataclass
class _Verification:
    tokens: list[int]  # the current token, then the n-gram's ngram - 1 guesses
    active: bool = True


@dataclass
class LookaheadState:
    """What upstream's LhdTokenGenerator keeps over a runner's life: the guesses and the n-gram pool."""

    cfg: LookaheadConfig
    seed: int = 0
    branch: list[list[int]] | None = None  # [ngram - 1][window]
    branch_prev: list[int] = field(default_factory=list)
    pool: dict[int, tuple[list[list[int]], int]] = field(default_factory=dict)  # token -> (n-grams, head)
    steps: int = 0  # model calls made by the decode loop
    accepted: int = 0  # tokens accepted from verification n-grams (upstream's n_accept)

    def __post_init__(self):
        self._rand = random.Random(self.seed)

    def init_branch(self, tokens: list[int]) -> None:
        """LHD:67-82: every guess a random token of the prompt (the first excluded) and the prefill's."""
        if self.branch is None:
            self.branch = [[tokens[1 + self._rand.randrange(len(tokens) - 1)]
                            for _ in range(self.cfg.window)] for _ in range(self.cfg.ngram - 1)]

    def verification(self, cur: int) -> list[_Verification]:
        return [_Verification([cur, *ngram]) for ngram in self.pool.get(cur, ([], 0))[0]]

    def step_inputs(self, cur: int, pos: int, checks: list[_Verification]) -> tuple[list[int], list[int]]:
        """Tokens and positions of one step's rows (LHD:234-259)."""
        w, branch = self.cfg.window, self.branch
        tokens, positions = [cur, *branch[0][1:]], [pos + i for i in range(w)]
        for i in range(1, self.cfg.ngram - 1):
            tokens += branch[i]
            positions += [pos + i + j for j in range(w)]
        for check in checks:
            tokens += check.tokens[1:]
            positions += [pos + j + 1 for j in range(self.cfg.ngram - 1)]
        return tokens, positions

    def row_of(self, g: int, v: int) -> int:
        """The row of verification n-gram g's token v (v >= 1), LHD:318-320."""
        return self.cfg.window * (self.cfg.ngram - 1) + g * (self.cfg.ngram - 1) + v - 1

    def advance(self, new_last_level: list[int]) -> None:
        """LHD:164-180 and 110-161: shift the levels, the samples become the last level; each column's
        finished n-gram (first token from the level that left) enters the pool unless already in it."""
        cfg, branch = self.cfg, self.branch
        self.branch_prev = list(branch[0])
        for j in range(cfg.ngram - 2):
            branch[j] = branch[j + 1]
        branch[cfg.ngram - 2] = new_last_level
        for f in range(cfg.window):
            first = self.branch_prev[f]
            ngram = [branch[j][f] for j in range(cfg.ngram - 1)]
            kept, head = self.pool.get(first, ([], 0))
            if ngram in kept:
                continue
            if len(kept) < cfg.gcap:
                kept.append(ngram)
            else:
                kept[head] = ngram
            self.pool[first] = (kept, (head + 1) % cfg.gcap)
