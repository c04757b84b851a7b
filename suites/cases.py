"""The suites' data formats: correctness cases, golden prefixes and throughput thresholds (TOML).

A user adds cases by editing these files, never code. Every error names the file and the entry.

Correctness cases (``suites/data/correctness.toml``)::

    [[case]]
    name = "story"                 # becomes the test id: test_updaters_agree[SM8650-hybrid-story]
    prompt = "Once upon a time"    # literal text, or:
    prompt_tokens = "chunk+1"      # a prompt of exactly N tokens after the chat template: an integer,
                                   # "chunk" (whole prefill chunks of the mode's ar_len), "chunk+1",
                                   # "max" (the longest prompt the mode takes), "max-8"
    modes = ["kv", "hybrid"]       # default: every mode of the bundle
    seq_lens = [128]               # default: [128] capped at the context; "context" = the model's;
                                   # "context*3": past the context, with the mode's attention-sink
                                   # evictor (skipped where the mode has none)
    gate = true                    # part of the pull-request subset (-m gate)

Golden prefixes (``goldens.toml`` beside the bundle manifest, or ``--farm-goldens``)::

    [[golden]]
    case = "story"
    mode = "hybrid"                # optional: any mode
    text_prefix = "Once upon a time,"   # or token_ids = [...]: the first generated tokens

Throughput thresholds (``thresholds.toml`` beside the manifest, ``suites/data/thresholds/<bundle
name>.toml`` or ``--farm-thresholds``)::

    warmup = 1                     # runs thrown away
    runs = 3                       # measured runs, all kept; the median is compared
    prompt = "Once upon a time"
    [[min]]                        # minimum tok/s (inference_speed.txt, prefill included, as upstream)
    soc = "SM8650"                 # "*" for any SoC
    mode = "hybrid"
    seq_len = 128
    updater = "SmartMask"
    tok_s = 37.0
    [[relative]]                   # `faster` may be at most max_slowdown_pct % slower than `slower`
    soc = "*"
    mode = "hybrid"
    seq_len = 128
    faster = "SmartMask"
    slower = "ShiftPointer"
    max_slowdown_pct = 10.0
    [ab]                           # the design of the A/B tests (relative rules, --farm-ab-baseline)
    min_blocks = 6                 # blocks (one run of each variant, in a random order) before a look
    max_blocks = 30                # the most blocks, then the verdict stands as it is
    look_every = 3
    alpha = 0.05                   # over all looks
    min_effect_pct = 2.0           # --farm-ab-baseline: a smaller difference is "same"
    [[baseline_ab]]                # --farm-ab-baseline's points [default: the default mode at
    mode = "hybrid"                #  seq_len 128 (capped at the context), SmartMask]
    seq_len = 128
    updater = "SmartMask"

A relative rule and an A/B against the baseline bundle are measured in interleaved blocks on the
same device, until the interval of the ratio decides (farm/results/ab.py). ``warmup`` blocks run
first and are dropped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.bundle.manifest import Bundle
from farm.bundle.tokens import (
    DEFAULT_SEQ_LEN,
    check_prompt_fits,
    context_len,
    fit_prompt,
    past_context_multiple,
    template_tokens,
)
from farm.config import read_toml
from farm.errors import UsageError
from farm.execute.runprofile import UPDATERS
from farm.results.ab import ABConfig

_TOKENS_RE = re.compile(r"^(chunk|max)\s*([+-]\s*\d+)?$")
def _field(entry: dict, key: str, types: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in entry:
        if default is ...:
            raise UsageError(f"{where}: missing key '{key}'")
        return default
    value = entry[key]
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise UsageError(f"{where}: key '{key}' has the wrong type ({type(value).__name__})")
    return value


def _positive_number(entry: dict, key: str, where: str, default: Any = ...) -> float:
    value = _field(entry, key, (int, float), where, default)
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{where}: key '{key}' must be a finite positive number, got {value!r}")
    return float(value)


def _check_keys(entry: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(entry) - known)
    if unknown:
        raise UsageError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(known))})")


# -- correctness cases ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    name: str
    prompt: str | None = None
    prompt_tokens: str | None = None  # "24", "chunk", "chunk+1", "max-8"
    modes: tuple[str, ...] = ()  # empty: every mode of the bundle
    seq_lens: tuple[str, ...] = ()  # "128", "context" or "context*N"; empty: the default
    gate: bool = False


@dataclass(frozen=True)
class CasePoint:
    """One case in one mode at one seq_len: one test per SoC."""

    case: Case
    mode: str
    seq_len: int
    id: str
    past_context: bool = False  # seq_len beyond the model's context: generated with the attention sink

    def prompt(self, bundle: Bundle) -> str:
        """The prompt text, checked to fit: a case that cannot run is bad input, not a failure of the
        runner (which would refuse it)."""
        if self.case.prompt is None:
            n = resolve_tokens(self.case.prompt_tokens or "", bundle, self.mode, self.seq_len)
            return fit_prompt(bundle, n)
        check_prompt_fits(bundle, self.case.prompt, self.mode, self.seq_len,
                          what=f"case {self.case.name!r}")
        return self.case.prompt


def load_cases(path: Path) -> list[Case]:
    raw, _ = read_toml(path)
    _check_keys(raw, {"case"}, str(path))
    entries = raw.get("case", [])
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"{path}: needs at least one [[case]] table")
    cases, names = [], set()
    for i, entry in enumerate(entries):
        where = f"{path}: case[{i}]"
        if not isinstance(entry, dict):
            raise UsageError(f"{where}: must be a table")
        _check_keys(entry, {"name", "prompt", "prompt_tokens", "modes", "seq_lens", "gate"}, where)
        name = _field(entry, "name", str, where)
        if not re.fullmatch(r"[A-Za-z0-9_.]+", name):
            raise UsageError(f"{where}: name {name!r} must be letters, digits, '_' or '.' "
                             "(it is part of the test id)")
        if name in names:
            raise UsageError(f"{where}: duplicate case name {name!r}")
        names.add(name)
        prompt = _field(entry, "prompt", str, where, None)
        tokens = _field(entry, "prompt_tokens", (int, str), where, None)
        if (prompt is None) == (tokens is None):
            raise UsageError(f"{where}: give exactly one of 'prompt' and 'prompt_tokens'")
        if prompt is not None and "\0" in prompt:
            raise UsageError(f"{where}: 'prompt' contains a NUL byte, which no argv can carry")
        if tokens is not None:
            tokens = str(tokens).strip()
            if not (tokens.isdigit() and int(tokens) > 0) and not _TOKENS_RE.match(tokens):
                raise UsageError(f"{where}: prompt_tokens {tokens!r} must be a positive integer, "
                                 "'chunk', 'chunk+N', 'max' or 'max-N'")
        modes = _field(entry, "modes", list, where, [])
        if not all(isinstance(m, str) for m in modes):
            raise UsageError(f"{where}: 'modes' must be a list of strings")
        seq_lens = _field(entry, "seq_lens", list, where, [])
        for s in seq_lens:
            if not (s == "context" or past_context_multiple(s)
                    or isinstance(s, int) and not isinstance(s, bool) and s >= 2):
                raise UsageError(f"{where}: seq_lens entry {s!r} must be an integer >= 2, 'context' "
                                 f"or 'context*N' (N >= 2: past the context, with the attention sink)")
        cases.append(Case(name=name, prompt=prompt, prompt_tokens=tokens, modes=tuple(modes),
                          seq_lens=tuple(str(s) for s in seq_lens),
                          gate=_field(entry, "gate", bool, where, False)))
    return cases


def case_points(cases: list[Case], bundle: Bundle) -> list[CasePoint]:
    """Expand cases over the bundle's modes and seq_lens. A case naming a mode the bundle lacks is bad
    input (it could never run)."""
    points = []
    context = context_len(bundle)
    for case in cases:
        modes = case.modes or tuple(sorted(bundle.modes))
        for mode in modes:
            if mode not in bundle.modes:
                raise UsageError(f"case {case.name!r}: bundle {bundle.name!r} has no mode {mode!r} "
                                 f"(modes: {', '.join(sorted(bundle.modes))})")
        seq_lens = [_seq_len(s, context) for s in case.seq_lens] or [min(DEFAULT_SEQ_LEN, context)]
        for mode in modes:
            for seq_len in dict.fromkeys(seq_lens):
                suffix = f"-{seq_len}" if len(case.seq_lens) > 1 else ""
                points.append(CasePoint(case, mode, seq_len, f"{mode}-{case.name}{suffix}",
                                        past_context=seq_len > context))
    return points


def _seq_len(spec: str, context: int) -> int:
    """A case's seq_lens entry: an integer (capped at the context), "context", or "context*N"."""
    if spec == "context":
        return context
    if multiple := past_context_multiple(spec):
        return context * multiple
    return min(int(spec), context)


def resolve_tokens(spec: str, bundle: Bundle, mode: str, seq_len: int) -> int:
    if spec.isdigit():
        n = int(spec)
    else:
        m = _TOKENS_RE.match(spec)
        assert m is not None  # checked at load
        if m.group(1) == "chunk":
            # Whole prefill chunks: the fewest that hold the chat template (a real llama3 template is
            # ~10 tokens, more than a tiny model's chunk), so "chunk" ends exactly on a boundary.
            ar_len = bundle.modes[mode].ar_len
            base = ar_len * max(1, -(-template_tokens(bundle) // ar_len))
        else:
            # The longest prompt the mode takes: prefill writes into a cache of context - ar_len;
            # lookahead decodes from a cache of context - decode_ar_len, so it leaves that much room.
            spec_mode = bundle.modes[mode]
            base = min(seq_len - 1,
                       context_len(bundle) - max(spec_mode.ar_len, spec_mode.decode_ar_len))
        n = base + int((m.group(2) or "0").replace(" ", ""))
    if n >= seq_len:
        raise UsageError(f"prompt_tokens {spec!r} is {n} tokens in mode {mode!r}: no room to "
                         f"generate within seq_len {seq_len}")
    return n


# -- goldens --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Golden:
    case: str
    mode: str | None
    text_prefix: str | None
    token_ids: tuple[int, ...] | None


def load_goldens(path: Path) -> list[Golden]:
    raw, _ = read_toml(path)
    _check_keys(raw, {"golden"}, str(path))
    goldens = []
    for i, entry in enumerate(raw.get("golden", [])):
        where = f"{path}: golden[{i}]"
        if not isinstance(entry, dict):
            raise UsageError(f"{where}: must be a table")
        _check_keys(entry, {"case", "mode", "text_prefix", "token_ids"}, where)
        text = _field(entry, "text_prefix", str, where, None)
        ids = _field(entry, "token_ids", list, where, None)
        if (text is None) == (ids is None) or text == "" or ids == []:
            raise UsageError(f"{where}: give exactly one non-empty 'text_prefix' or 'token_ids'")
        if ids is not None and not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise UsageError(f"{where}: 'token_ids' must be integers")
        goldens.append(Golden(case=_field(entry, "case", str, where),
                              mode=_field(entry, "mode", str, where, None), text_prefix=text,
                              token_ids=tuple(ids) if ids is not None else None))
    return goldens


def golden_for(goldens: list[Golden], case: str, mode: str) -> Golden | None:
    exact = [g for g in goldens if g.case == case and g.mode == mode]
    return (exact or [g for g in goldens if g.case == case and g.mode is None] or [None])[0]


# -- throughput thresholds ------------------------------------------------------------------------

@dataclass(frozen=True)
class MinRule:
    soc: str
    mode: str
    seq_len: int
    updater: str
    tok_s: float


@dataclass(frozen=True)
class RelativeRule:
    soc: str
    mode: str
    seq_len: int
    faster: str
    slower: str
    max_slowdown_pct: float


@dataclass(frozen=True)
class BaselinePoint:
    """A point the A/B against the baseline bundle (--farm-ab-baseline) measures."""

    mode: str
    seq_len: int
    updater: str


@dataclass(frozen=True)
class Thresholds:
    path: Path
    warmup: int
    runs: int
    prompt: str
    minimums: tuple[MinRule, ...]
    relative: tuple[RelativeRule, ...]
    ab: ABConfig = ABConfig()
    baseline_points: tuple[BaselinePoint, ...] = ()  # empty: the default point

    def minimum(self, soc: str, mode: str, seq_len: int, updater: str) -> MinRule | None:
        rules = [r for r in self.minimums if (r.mode, r.seq_len, r.updater) == (mode, seq_len, updater)]
        exact = [r for r in rules if r.soc == soc]
        return (exact or [r for r in rules if r.soc == "*"] or [None])[0]

    def relative_rule(self, soc: str, rule: RelativeRule) -> RelativeRule | None:
        same = [r for r in self.relative if (r.mode, r.seq_len, r.faster, r.slower) ==
                (rule.mode, rule.seq_len, rule.faster, rule.slower)]
        exact = [r for r in same if r.soc == soc]
        return (exact or [r for r in same if r.soc == "*"] or [None])[0]


def _rule_point(entry: dict, where: str, bundle: Bundle | None) -> tuple[str, str, int]:
    soc = _field(entry, "soc", str, where).strip().upper()
    mode = _field(entry, "mode", str, where)
    if bundle is not None and mode not in bundle.modes:
        raise UsageError(f"{where}: bundle {bundle.name!r} has no mode {mode!r}")
    seq_len = _field(entry, "seq_len", int, where)
    if seq_len < 2:
        raise UsageError(f"{where}: key 'seq_len' must be at least 2, got {seq_len}")
    return soc, mode, seq_len


def _updater(entry: dict, key: str, where: str) -> str:
    value = _field(entry, key, str, where)
    if value not in UPDATERS:
        raise UsageError(f"{where}: key '{key}' is {value!r}, expected one of {', '.join(UPDATERS)}")
    return value


def load_thresholds(path: Path, bundle: Bundle | None = None) -> Thresholds:
    raw, _ = read_toml(path)
    where = str(path)
    _check_keys(raw, {"warmup", "runs", "prompt", "min", "relative", "bundle", "ab", "baseline_ab"}, where)
    warmup = _field(raw, "warmup", int, where, 1)
    runs = _field(raw, "runs", int, where, 3)
    if warmup < 0 or runs < 1:
        raise UsageError(f"{where}: 'warmup' must be >= 0 and 'runs' >= 1")
    minimums = []
    for i, entry in enumerate(raw.get("min", [])):
        w = f"{where}: min[{i}]"
        _check_keys(entry, {"soc", "mode", "seq_len", "updater", "tok_s"}, w)
        soc, mode, seq_len = _rule_point(entry, w, bundle)
        minimums.append(MinRule(soc, mode, seq_len, _updater(entry, "updater", w),
                                _positive_number(entry, "tok_s", w)))
    relative = []
    for i, entry in enumerate(raw.get("relative", [])):
        w = f"{where}: relative[{i}]"
        _check_keys(entry, {"soc", "mode", "seq_len", "faster", "slower", "max_slowdown_pct"}, w)
        soc, mode, seq_len = _rule_point(entry, w, bundle)
        pct = _field(entry, "max_slowdown_pct", (int, float), w)
        if not math.isfinite(pct) or not 0 <= pct < 100:
            raise UsageError(f"{w}: key 'max_slowdown_pct' must be in [0, 100), got {pct!r}")
        relative.append(RelativeRule(soc, mode, seq_len, _updater(entry, "faster", w),
                                     _updater(entry, "slower", w), float(pct)))
    baseline_points = []
    for i, entry in enumerate(raw.get("baseline_ab", [])):
        w = f"{where}: baseline_ab[{i}]"
        if not isinstance(entry, dict):
            raise UsageError(f"{w}: must be a table")
        _check_keys(entry, {"mode", "seq_len", "updater"}, w)
        _, mode, seq_len = _rule_point({**entry, "soc": "*"}, w, bundle)
        baseline_points.append(BaselinePoint(mode, seq_len, _updater(entry, "updater", w)))
    return Thresholds(path=Path(path), warmup=warmup, runs=runs,
                      prompt=_field(raw, "prompt", str, where, "Once upon a time"),
                      minimums=tuple(minimums), relative=tuple(relative),
                      ab=_ab_design(raw.get("ab", {}), f"{where}: [ab]"),
                      baseline_points=tuple(baseline_points))


def _ab_design(entry: Any, where: str) -> ABConfig:
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: must be a table")
    _check_keys(entry, {"min_blocks", "max_blocks", "look_every", "alpha", "min_effect_pct"}, where)
    default = ABConfig()
    try:
        design = ABConfig(alpha=float(_field(entry, "alpha", (int, float), where, default.alpha)),
                          min_effect=float(_field(entry, "min_effect_pct", (int, float), where,
                                                  default.min_effect * 100)) / 100,
                          min_blocks=_field(entry, "min_blocks", int, where, default.min_blocks),
                          max_blocks=_field(entry, "max_blocks", int, where, default.max_blocks),
                          look_every=_field(entry, "look_every", int, where, default.look_every))
        design.check_decidable(1)  # the suites' A/Bs run on the test's one device
        return design
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
