"""Tokenizers: the three formats qnn_llama_runner v1.0.1 loads, and the reference bundles' own.

Upstream's runner hands ``--tokenizer_path`` to ``llm::load_tokenizer`` (extension/llm/runner/
llm_runner_helper.cpp at v1.0.1), which tries each loader of pytorch/tokenizers in turn: an HF
``tokenizer.json`` (or a directory holding one), a tiktoken file (Llama 3's specials appended), a
SentencePiece model, a llama2c ``tokenizer.bin``. The farm reads the three formats v1.0.1's bundles ship
(HF, tiktoken, llama2c), told apart by their content in the same order, and encodes and decodes with the
same library: tiktoken through pytorch_tokenizers' Python TiktokenTokenizer (the same ranks, pattern and
specials as its C++ Tiktoken), HF and llama2c through pytorch_tokenizers' bindings of the very C++ classes
the runner links (their BOS/EOS choice, special-token matching and merges are upstream's by construction).

One place for the runner (farm/runner) and the plugin's prompt fitting (farm/bundle/tokens.py).

The reference bundles' tokenizers are byte-level BPEs learnt here, deterministically, from a short
built-in text, so that every input encodes: Llama 3's tiktoken ``tokenizer.model`` (one ``base64(token)
rank`` line per token; readers append Llama 3's 256 specials) and a Qwen2-style HF ``tokenizer.json``.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import os
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import regex

from farm.errors import UsageError
from farm.fileio import write_atomic

# The split pattern of Llama 3 / cl100k (pytorch_tokenizers' default for tiktoken files).
PAT_STR = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2's (tokenizer.json of Qwen2.5): Llama 3's, with digits one by one.
QWEN2_PAT_STR = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2.5's first special tokens, after the base tokens as in Qwen's file. Without a tokenizer_config.json
# upstream's HFTokenizer guesses the BOS and EOS from the specials' names ("begin"/"bos", "end"/"eos"), and
# how it breaks a tie between several "end" tokens differs between pytorch-tokenizers versions (1.5.0 gives
# up and takes id 0 for <|endoftext|> + <|im_end|>): with <|endoftext|> the only "end" token every
# version takes it for both, as qwen2_5 means it.
QWEN2_SPECIALS = ("<|endoftext|>", "<|im_start|>")
# SmolVLM's (HuggingFaceTB/SmolVLM-500M-Instruct tokenizer.json added tokens) that 1.4.1's multimodal
# runner writes or looks up: vision_chat_template.h's image wrapping, the end of a turn
# (multimodal_runner.cpp:199-201).
SMOLVLM_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>",
                    "<global-img>", "<image>")

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

FORMATS = ("hf", "tiktoken", "llama2c")
KNOWN = "an HF tokenizer.json, a tiktoken tokenizer.model or a llama2c tokenizer.bin"
LLAMA2C_BYTE_PIECES = range(3, 3 + 256)  # <0x00>..<0xFF>: the llama2c encoder's byte fallback


# -- reading -----------------------------------------------------------------------------------------

class Tokenizer:
    """A loaded tokenizer, whatever its format: what the runner and the prompt fitting use."""

    path: Path
    format: str
    n_words: int
    bos_id: int
    eos_id: int
    special_tokens: dict[str, int]  # text -> id of the tokens the encoder matches in text as a whole

    def encode(self, text: str, *, bos: bool, eos: bool = False) -> list[int]:
        """Ids of ``text`` as upstream's runner encodes a prompt: special tokens written in the text
        are those tokens, and ``bos`` (``eos``) puts the BOS first (the EOS last) where the format's
        encoder does."""
        raise NotImplementedError

    def piece(self, token_id: int, prev_id: int | None = None) -> bytes:
        """The bytes upstream's ``decode(prev, token)`` gives for one token (its piece in outputs.txt)."""
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` (each piece decoded after its predecessor), undecodable bytes replaced."""
        pieces = (self.piece(t, prev) for prev, t in zip([None, *ids], ids))
        return b"".join(pieces).decode("utf-8", "replace")


class _Tiktoken(Tokenizer):
    format = "tiktoken"

    def __init__(self, path: Path):
        from pytorch_tokenizers.tiktoken import TiktokenTokenizer

        self.path = path
        self._tok = TiktokenTokenizer(str(path))
        self.n_words, self.bos_id, self.eos_id = self._tok.n_words, self._tok.bos_id, self._tok.eos_id
        self.special_tokens = dict(self._tok.special_tokens)

    def encode(self, text: str, *, bos: bool, eos: bool = False) -> list[int]:
        return self._tok.encode(text, bos=bos, eos=eos, allowed_special="all")

    def piece(self, token_id: int, prev_id: int | None = None) -> bytes:
        return self._tok.model.decode_single_token_bytes(token_id)


class _Bound(Tokenizer):
    """HF and llama2c: pytorch_tokenizers' bindings of the C++ classes upstream's runner links."""

    def __init__(self, path: Path, fmt: str, tok, special_tokens: dict[str, int]):
        self.path, self.format, self._tok = path, fmt, tok
        self.n_words, self.bos_id, self.eos_id = tok.vocab_size(), tok.bos_tok(), tok.eos_tok()
        self.special_tokens = special_tokens

    def encode(self, text: str, *, bos: bool, eos: bool = False) -> list[int]:
        return list(self._tok.encode(text, int(bos), int(eos)))

    def piece(self, token_id: int, prev_id: int | None = None) -> bytes:
        if not 0 <= token_id < self.n_words:
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{self.n_words - 1})")
        try:
            text = self._tok.decode(token_id)  # the binding passes prev = token
            piece = text.encode("utf-8")
        except UnicodeDecodeError as e:
            # A byte-level piece that is part of a UTF-8 character: the binding's str conversion
            # refuses it, and the error carries the bytes the C++ decode returned.
            piece = bytes(e.object)
        if self.format == "llama2c" and prev_id == self.bos_id and piece.startswith(b" "):
            piece = piece[1:]  # llama2c_tokenizer.cpp: after the BOS, the leading space is dropped
        return piece


def load_tokenizer(path: str | os.PathLike, what: str = "--tokenizer_path") -> Tokenizer:
    """The tokenizer at ``path`` in whichever of the three formats it is, or a UsageError that starts
    with ``what`` and names the file and what it is instead."""
    p = Path(path)
    fmt, file = detect_format(p, what)
    loaders: dict[str, Callable[[Path], Tokenizer]] = {
        "tiktoken": _Tiktoken, "hf": _load_hf, "llama2c": _load_llama2c}
    try:
        with _library_log() as log:
            tok = loaders[fmt](file)
    except UsageError:
        raise
    except Exception as e:  # each loader raises its own assortment on a damaged file
        said = log.text()
        raise UsageError(f"{what}: {p} looks like {_NAMES[fmt]} but does not load: "
                         f"{type(e).__name__}: {str(e)[:160]}" + (f" ({said[:200]})" if said else "")
                         ) from None
    if tok.n_words < 256:
        raise UsageError(f"{what}: {p} ({_NAMES[fmt]}) has only {tok.n_words} tokens")
    return tok


_NAMES = {"hf": "an HF tokenizer.json", "tiktoken": "a tiktoken file", "llama2c": "a llama2c tokenizer.bin"}


def detect_format(p: Path, what: str = "--tokenizer_path") -> tuple[str, Path]:
    """(format, the file to read): by content, in upstream's order (HF's JSON, tiktoken, llama2c)."""
    if p.is_dir():
        # HFTokenizer::load takes a directory that holds tokenizer.json (and reads its
        # tokenizer_config.json for the BOS and EOS); no other loader takes a directory.
        if (p / "tokenizer.json").is_file():
            return "hf", p
        raise UsageError(f"{what}: {p} is a directory, not a tokenizer file (a tokenizer directory "
                         "holds tokenizer.json)")
    if not p.exists():
        raise UsageError(f"{what}: {p} does not exist")
    if not p.is_file():
        raise UsageError(f"{what}: {p} is not a regular file")
    try:
        with p.open("rb") as f:
            head = f.read(4096)
        size = p.stat().st_size
    except OSError as e:
        raise UsageError(f"{what}: cannot read {p}: {e.strerror}") from None
    if not head:
        raise UsageError(f"{what}: {p} is empty, not a tokenizer")
    if head.lstrip()[:1] == b"{":
        return "hf", _check_hf_json(p, what)
    first = head.split(b"\n", 1)[0].strip()
    if regex.fullmatch(rb"[A-Za-z0-9+/]+=*\s+\d+", first):
        return "tiktoken", p
    problem = _llama2c_problem(p, size)
    if problem is None:
        return "llama2c", p
    if problem != "not llama2c":
        raise UsageError(f"{what}: {p} is a damaged llama2c tokenizer.bin: {problem}")
    raise UsageError(f"{what}: {p} is not a tokenizer of any format the runner reads ({KNOWN})")


def _check_hf_json(p: Path, what: str) -> Path:
    try:
        doc = json.loads(p.read_bytes())
    except (ValueError, OSError) as e:
        raise UsageError(f"{what}: {p} starts as JSON but is not valid JSON: {str(e)[:120]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise UsageError(f"{what}: {p} is JSON but not an HF tokenizer.json (no 'model' object)")
    if doc["model"].get("type", "BPE") != "BPE":
        raise UsageError(f"{what}: {p} is an HF tokenizer.json of model type "
                         f"{doc['model'].get('type')!r}; upstream's HFTokenizer reads BPE only")
    return p


def _llama2c_problem(p: Path, size: int) -> str | None:
    """None for a whole llama2c file (llama2c_tokenizer.cpp's layout: int32 vocab size, BOS, EOS, max
    token length, then per token a float32 score, an int32 length and the bytes); "not llama2c" when the
    header is not one; else what is wrong. The C++ loader trusts the header and its encoder indexes the
    byte pieces directly, so a damaged file would crash it: it is checked whole here first."""
    if size < 16:
        return "not llama2c"
    with p.open("rb") as f:
        vocab, bos, eos, max_len = struct.unpack("<4i", f.read(16))
        if not (0 < vocab <= 10_000_000 and 0 <= bos < vocab and 0 <= eos < vocab and 0 < max_len < 4096):
            return "not llama2c"
        if vocab <= LLAMA2C_BYTE_PIECES[-1]:
            return f"{vocab} tokens, fewer than the 259 its encoder needs (3 + 256 byte pieces)"
        for i in range(vocab):
            entry = f.read(8)
            if len(entry) < 8:
                # llama2c_tokenizer.cpp pads a vocabulary cut short after a whole entry with <pad>.
                return None if not entry and i > LLAMA2C_BYTE_PIECES[-1] else \
                    f"it ends inside token {i} of {vocab}"
            _score, length = struct.unpack("<fi", entry)
            if not 0 <= length <= max_len:
                return f"token {i} has length {length} (the header's maximum is {max_len})"
            piece = f.read(length)
            if len(piece) < length:
                return f"it ends inside token {i} of {vocab}"
            if i in LLAMA2C_BYTE_PIECES and piece != f"<0x{i - 3:02X}>".encode():
                return f"token {i} is {piece[:20]!r}, not the byte piece <0x{i - 3:02X}>"
    return None


def _load_hf(path: Path) -> Tokenizer:
    lib = _library()
    tok = lib.CppHFTokenizer()
    tok.load(str(path))
    doc = json.loads((path / "tokenizer.json" if path.is_dir() else path).read_bytes())
    specials = {t["content"]: t["id"] for t in doc.get("added_tokens", []) if t.get("special")}
    return _Bound(path, "hf", tok, specials)


def _load_llama2c(path: Path) -> Tokenizer:
    tok = _library().CppLlama2cTokenizer()
    tok.load(str(path))
    return _Bound(path, "llama2c", tok, {})  # llama2c matches no special token in text


# -- the library's log lines --------------------------------------------------------------------------

def preload() -> None:
    """Import the tokenizer libraries a load would import (pytorch_tokenizers and its tiktoken,
    sentencepiece and HF backends), for a process that forks runs: the runner zygote's children then
    import none of them (33 modules, ~15 ms of every run)."""
    _library()


def _library():
    """pytorch_tokenizers, imported with its C++ start-up line ("I tokenizers:regex.cpp:40] Registering
    override fallback regex", written to fd 2 at import) kept off stderr: the runner's stderr is what a
    failure message quotes, and that line led every one of them."""
    if "pytorch_tokenizers" not in sys.modules:
        with _fd2_to(open(os.devnull, "wb")):
            import pytorch_tokenizers  # noqa: F401
    return sys.modules["pytorch_tokenizers"]


class _Log:
    def __init__(self, file):
        self._file = file

    def text(self) -> str:
        """What the C++ library wrote, on one line, its 'E tokenizers:file.cpp:N]' prefixes dropped."""
        self._file.seek(0)
        lines = self._file.read().decode("utf-8", "replace").splitlines()
        return " | ".join(regex.sub(r"^[DIEF] tokenizers:\S+\] ", "", line).strip()
                          for line in lines if line.strip())


@contextlib.contextmanager
def _library_log() -> Iterator[_Log]:
    """Catch what the C++ tokenizers write to fd 2 while loading (their TK_LOG has no switch): kept
    for the error message of a file that does not load, never shown otherwise."""
    _library()
    with _fd2_to(tempfile.TemporaryFile()) as log:
        yield _Log(log)


@contextlib.contextmanager
def _fd2_to(file) -> Iterator:
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with file:
            os.dup2(file.fileno(), 2)
            try:
                yield file
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


# -- the reference bundles' tokenizers ------------------------------------------------------------------

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


SENTENCEPIECE_VOCAB = 400  # 3 specials, 256 byte pieces, 141 merges


def write_sentencepiece_tokenizer(model_path: Path, bin_path: Path, text: str = CORPUS,
                                  vocab_size: int = SENTENCEPIECE_VOCAB) -> int:
    """The stories families' pair, as upstream ships them: a SentencePiece BPE ``tokenizer.model``
    trained on ``text`` (<unk> <s> </s>, then the byte pieces <0x00>..<0xFF>: byte fallback, which the
    llama2c encoder needs), which llama.py's TokenizerWrapper reads (tokenizer.py:96-105), and the
    ``tokenizer.bin`` the runner reads, exported from it by pytorch_tokenizers' Llama2cTokenizer.export
    as upstream exports it. One thread and SentencePiece's own defaults otherwise: the same file on
    every machine. Returns the vocabulary size."""
    import io

    import sentencepiece
    from pytorch_tokenizers.llama2c import Llama2cTokenizer

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()), model_writer=model, model_type="bpe",
        vocab_size=vocab_size, byte_fallback=True, character_coverage=1.0, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, num_threads=1,
        minloglevel=2)
    write_atomic(model_path, model.getvalue())
    Llama2cTokenizer(str(model_path)).export(str(bin_path))
    return vocab_size


def write_hf_tokenizer(path: Path, text: str = CORPUS, n_merges: int = N_MERGES,
                       specials: tuple[str, ...] = QWEN2_SPECIALS) -> int:
    """A Qwen2-style byte-level BPE ``tokenizer.json`` learnt by HF's ``tokenizers`` from ``text``:
    the regex split then byte-level pre-tokenizer and decoder of Qwen2.5's file, 256 byte tokens and
    ``n_merges`` merges, ``specials`` (Qwen's) after them. Returns the number of base (non-special) tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PAT_STR), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + n_merges, initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator([text], trainer)
    n_base = tok.get_vocab_size()
    tok.add_special_tokens(list(specials))
    write_atomic(path, tok.to_str(pretty=True))
    return n_base
