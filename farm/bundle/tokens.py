"""Token counts with a bundle's own tokenizer and chat template: what the runner will feed.

A prompt that cannot fit a mode is bad input, found on the host before any lease; the suites' case
format (``prompt_tokens = "chunk+1"``, suites/cases.py) builds prompts of exact token counts from here.
"""

from __future__ import annotations

import re
from typing import Any

from farm.bundle.manifest import Bundle
from farm.errors import UsageError
from farm.vocab import Dialect

DEFAULT_SEQ_LEN = 128
FILLER = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
          "sunshine with her friend Tom, and every day they walked along the river to the old park. ")


_PAST_CONTEXT_RE = re.compile(r"context\s*\*\s*([2-9]|[1-9]\d+)")


def past_context_multiple(seq_len: object) -> int | None:
    """N for a cases file's seq_lens entry "context*N" (N >= 2: generation past the context window,
    with the attention sink), None for anything else ("context", an integer, "context*1")."""
    m = _PAST_CONTEXT_RE.fullmatch(seq_len) if isinstance(seq_len, str) else None
    return int(m.group(1)) if m else None


# -- correctness cases ----------------------------------------------------------------------------

def check_prompt_fits(bundle: Bundle, prompt: str, mode: str, seq_len: int, *, what: str) -> None:
    """UsageError if the runner would refuse the prompt (too long for the mode and seq_len): a request
    that cannot work is bad input, not a failure of the code under test. Unchecked when the host cannot
    read the bundle's tokenizer (the runner then judges)."""
    try:
        n = count_tokens(bundle, prompt)
    except UsageError:
        return
    limit = min(seq_len - 1, context_len(bundle) - bundle.modes[mode].ar_len)
    if n > limit:
        raise UsageError(f"{what}: the prompt is {n} tokens with the chat template; mode {mode!r} at "
                         f"seq_len {seq_len} takes at most {limit}")


def context_len(bundle: Bundle) -> int:
    """The model's context, or the default seq_len when the manifest does not say."""
    known = bundle.context()
    return known[0] if known is not None else DEFAULT_SEQ_LEN


_fitted: dict[tuple[str, str, str, int], str] = {}  # (tokenizer file, version, n) -> prompt
_templates: dict[tuple[str, str, str], Any] = {}


def _tokenizer_key(bundle: Bundle) -> tuple[str, str, str]:
    """The tokenizer's file on the host, the template version and the upstream release whose templates
    the runner applies: what token counts depend on. An ``auto`` bundle's release is v1.0.1's until its
    runner is asked (on a device): the counts of a qnn-v1.4 runner differ only where v1.4.1 changed a
    template (smollm2_135m: an assistant turn more)."""
    dialect = bundle.runner_dialect
    upstream = Dialect(dialect).templates if dialect in tuple(Dialect) else Dialect.HOST.templates
    return str(next(f for f in bundle.files if f.name == bundle.tokenizer).path), \
        bundle.decoder_model_version, upstream


def _template(bundle: Bundle):
    """The bundle's tokenizer (any format the runner reads) and chat template; a UsageError naming the
    bundle and the tokenizer file when it cannot be read or the version is unknown."""
    from farm.model.template import PromptTemplate
    from farm.model.tokenizer import load_tokenizer

    key = _tokenizer_key(bundle)
    if key not in _templates:
        tok_file, version, upstream = key
        what = f"bundle {bundle.name!r}: tokenizer"
        try:
            _templates[key] = PromptTemplate(load_tokenizer(tok_file, what=what), version, upstream)
        except UsageError as e:
            if str(e).startswith(what):
                raise
            reason = str(e).removeprefix("--decoder_model_version: ")
            raise UsageError(f"bundle {bundle.name!r}: decoder_model_version: {reason}") from None
    return _templates[key]


def count_tokens(bundle: Bundle, prompt: str) -> int:
    """Tokens the runner feeds for ``prompt``: the chat template included, as it builds them."""
    template = _template(bundle)
    text = template.format(prompt, "")
    if not text:  # llama2c's encoder refuses empty text (a template that is the prompt alone, llama2's)
        return len(template.encode_turn("x", "", first=True)) - len(template.encode("x", bos=False))
    return len(template.encode_turn(prompt, "", first=True))


def template_tokens(bundle: Bundle) -> int:
    return count_tokens(bundle, "")


def fit_prompt(bundle: Bundle, n_tokens: int) -> str:
    """A prompt that the runner turns into exactly ``n_tokens`` tokens (chat template included), made
    from filler text with the bundle's own tokenizer."""
    key = (*_tokenizer_key(bundle), n_tokens)
    if key in _fitted:
        return _fitted[key]

    def count(text: str) -> int:
        return count_tokens(bundle, text)

    if count("") > n_tokens:
        raise UsageError(f"a prompt of {n_tokens} tokens is shorter than the chat template itself "
                         f"({count('')} tokens)")
    filler = FILLER
    while count(filler) < n_tokens:
        filler += FILLER
    lo, hi = 0, len(filler)  # smallest prefix length with count >= n_tokens
    while lo < hi:
        mid = (lo + hi) // 2
        if count(filler[:mid]) >= n_tokens:
            hi = mid
        else:
            lo = mid + 1
    for length in range(lo, min(lo + 64, len(filler) + 1)):
        text = filler[:length]
        if count(text) == n_tokens:
            _fitted[key] = text
            return text
    raise UsageError(f"cannot build a prompt of exactly {n_tokens} tokens with {bundle.tokenizer}")


# -- goldens --------------------------------------------------------------------------------------

# -- throughput thresholds ------------------------------------------------------------------------

