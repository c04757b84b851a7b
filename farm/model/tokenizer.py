"""The reference tokenizer: a byte-level BPE written in tiktoken's `tokenizer.model` format.

Llama 3.2 ships a tiktoken-format `tokenizer.model` (one `base64(token) rank` line per token) and the
real qnn_llama_runner reads that format, so the reference bundle uses it too. The merges are learnt here,
deterministically, from a short built-in text: every byte is a token, so any input encodes.
Special tokens are not in the file: readers append Llama 3's 256 specials after the base tokens.
"""

from __future__ import annotations

import base64
import collections
import os
from pathlib import Path

import regex

from farm.errors import UsageError
from farm.fileio import write_atomic

# The split pattern of Llama 3 / cl100k (pytorch_tokenizers' default for tiktoken files).
PAT_STR = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = """\
Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine.
One day, she saw a big, red ball in the park. She ran to the ball and kicked it as hard as she could.
The ball flew over the trees and landed in the river. Lily was sad, but her friend Tom came to help.
Tom said, "Don't worry, we can get the ball back together." They walked along the river and found a
long stick. Tom held the stick and pulled the ball out of the water. Lily smiled and thanked him.
The model runs on the phone. The farm deploys the program, the tokenizer and the runner to every device,
then it runs the prompts and compares the tokens of both updaters at temperature zero.
What is the capital of France? The capital of France is Paris. Write a story about a dog and a cat.
"""

N_MERGES = 256


def train_ranks(text: str = CORPUS, n_merges: int = N_MERGES) -> dict[bytes, int]:
    """Byte-level BPE: 256 byte tokens, then the most frequent adjacent pair, merged n_merges times."""
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    words = collections.Counter(m.encode() for m in regex.findall(PAT_STR, text))
    pieces = {w: [bytes([b]) for b in w] for w in words}
    for _ in range(n_merges):
        pairs: collections.Counter[tuple[bytes, bytes]] = collections.Counter()
        for w, parts in pieces.items():
            for a, b in zip(parts, parts[1:]):
                pairs[(a, b)] += words[w]
        if not pairs:
            break
        # Ties broken by the bytes themselves, so the file is the same on every machine.
        (a, b), _count = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merged = a + b
        ranks[merged] = len(ranks)
        for w, parts in pieces.items():
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            pieces[w] = out
    return ranks


def write_tiktoken_model(path: Path, ranks: dict[bytes, int]) -> None:
    lines = [f"{base64.b64encode(tok).decode()} {rank}\n" for tok, rank in
             sorted(ranks.items(), key=lambda kv: kv[1])]
    write_atomic(path, "".join(lines))


def load_tokenizer(path: str | os.PathLike):
    """A pytorch_tokenizers TiktokenTokenizer, or a UsageError naming the file."""
    from pytorch_tokenizers.tiktoken import TiktokenTokenizer

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--tokenizer_path: {p} does not exist")
    try:
        tok = TiktokenTokenizer(str(p))
    except Exception as e:  # the loader raises assorted ValueErrors/binascii errors on bad files
        raise UsageError(f"--tokenizer_path: {p} is not a tiktoken tokenizer.model file: "
                         f"{type(e).__name__}: {str(e)[:120]}") from None
    if tok.n_words < 512:
        raise UsageError(f"--tokenizer_path: {p} has only {tok.n_words} tokens")
    return tok
