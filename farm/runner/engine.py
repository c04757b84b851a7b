"""The host runner's engine: load a static-llama .pte, prefill and decode through a KV I/O manager.

It follows qnn_llama_runner v1.0.1: eval_mode 0 runs everything through `forward` (ar_len 1); eval_mode 1
prefills in chunks of ar_len P with `prefill_forward` (the last chunk shorter) and decodes with
`kv_forward`. Timestamps and the tokens/second figure are taken where upstream takes them.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from farm.errors import UsageError
from farm.model.llama import MASK_MIN, causal_block
from farm.model.template import PromptTemplate, check_version
from farm.runner import io_v14
from farm.runner.io_manager import UPDATERS, ContextFull, IoMgr, KVShape
from farm.runner.lookahead import LookaheadConfig, LookaheadState
from farm.runner.timing import WallClock
from farm.vocab import EvalMode

# --eval_mode -> (prefill method, decode method), runner.cpp:162-178; lookahead (2) decodes with a
# kv_forward of ar_len >= (window + gcap) * (ngram - 1) (farm/runner/lookahead.py).
LOOKAHEAD = 2
METHODS = {EvalMode.KV.number: ("forward", "forward"),
           EvalMode.HYBRID.number: ("prefill_forward", "kv_forward"),
           LOOKAHEAD: ("prefill_forward", "kv_forward")}


now_ms = WallClock.now_ms  # the host's clock, for what upstream times on it (model load)


# extension/llm/runner/stats.h, stats_to_json_string: the observer line's keys, in its order.
OBSERVER_KEYS = ("prompt_tokens", "generated_tokens", "model_load_start_ms", "model_load_end_ms",
                 "inference_start_ms", "inference_end_ms", "prompt_eval_end_ms", "first_token_ms",
                 "aggregate_sampling_time_ms", "SCALING_FACTOR_UNITS_PER_SECOND")
SCALING_FACTOR_UNITS_PER_SECOND = 1000


@dataclass
class Stats:
    """Upstream's ``Stats`` (extension/llm/runner/stats.h): one per runner, never reset between prompts
    or iterations; each generate call overwrites its own fields, sampling time accumulates."""

    model_load_start_ms: int = 0
    model_load_end_ms: int = 0
    inference_start_ms: int = 0
    prompt_eval_end_ms: int = 0
    first_token_ms: int = 0
    inference_end_ms: int = 0
    aggregate_sampling_time_ms: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0  # the decode loop's steps: the token prefill produced is not counted

    def to_json(self) -> dict:
        values = dict(self.__dict__, SCALING_FACTOR_UNITS_PER_SECOND=SCALING_FACTOR_UNITS_PER_SECOND)
        return {key: values[key] for key in OBSERVER_KEYS}

    def observer_line(self, rates: bool = False) -> str:
        """``PyTorchObserver {json}``, compact, as print_report prints it after every prompt. ``rates``:
        v1.4.1's, which starts with the prefill and decode rates, each only when its interval is
        positive, written as ``operator<<`` writes a double (stats.h v1.4.1:100-117)."""
        values = self.to_json()
        head = ""
        if rates:
            prefill_ms = self.prompt_eval_end_ms - self.inference_start_ms
            decode_ms = self.inference_end_ms - self.prompt_eval_end_ms
            if prefill_ms > 0:
                head += f'"prefill_token_per_sec":{cpp_double(self.prompt_tokens / prefill_ms * SCALING_FACTOR_UNITS_PER_SECOND)},'
            if decode_ms > 0:
                head += f'"decode_token_per_sec":{cpp_double(self.generated_tokens / decode_ms * SCALING_FACTOR_UNITS_PER_SECOND)},'
        body = json.dumps(values, separators=(",", ":"))
        return "PyTorchObserver {" + head + body[1:]

    def tokens_per_second(self) -> float:
        """inference_speed.txt (runner.cpp print_performance_report): generated tokens over the
        inference time, prefill included; prompt tokens over the prompt time when none was generated.
        A zero interval gives inf, as the C++ division does."""
        if self.generated_tokens:
            n, elapsed_ms = self.generated_tokens, self.inference_end_ms - self.inference_start_ms
        else:
            n, elapsed_ms = self.prompt_tokens, self.prompt_eval_end_ms - self.inference_start_ms
        if elapsed_ms == 0:
            return math.inf if n else math.nan
        return n / elapsed_ms * SCALING_FACTOR_UNITS_PER_SECOND


def cpp_double(value: float) -> str:
    """A double as ``std::ostream << double`` writes it by default: %g with 6 significant digits."""
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    return format(value, ".6g")


@dataclass
class Generation:
    """One prompt's generate call (runner.cpp generate_from_prompt_or_file)."""

    prompt_ids: list[int]
    generated_ids: list[int]  # every token written: the one prefill produced, then the decode loop's
    text: bytes  # what the call adds to outputs.txt: the echoed prompt, then each token's piece
    stats: Stats
    reached_eos: bool = False
    newlines: int = 0  # the printf("\n") upstream's generator made: 1 at EOS (lookahead: 2, LHD:340,385)


class LlamaRunner:
    """One loaded program and its KV caches. Like upstream's Runner, its position (``cur_pos``) carries
    over from one generate call to the next, across turns and iterations alike."""

    def __init__(self, model_path: str, tokenizer_path: str, eval_mode: int,
                 io_mgr_cls: type[IoMgr], decoder_model_version: str = "llama3",
                 dump_logits: bool = False, lookahead: LookaheadConfig | None = None,
                 seed: int = 0, upstream: str = "v1.0.1", kv_method: str = "forward",
                 attention_sink_rope_path: str = "", flag: str = "--model_path",
                 make_template=None):
        """``flag``: the runner's flag naming ``model_path``, for messages; ``make_template``: the
        prompt template of another runner's models (farm/runner/multimodal.py), from the tokenizer."""
        from farm.model.tokenizer import load_tokenizer

        if eval_mode not in METHODS:
            raise UsageError(f"--eval_mode: {eval_mode} ({EvalMode.from_number(eval_mode) or 'unknown'}) "
                             "is not supported; use 0 (kv), 1 (hybrid) or 2 (lookahead)")
        if make_template is None:
            check_version(decoder_model_version, upstream)  # upstream: whose templates (farm.model.template)
        self.stats = Stats(model_load_start_ms=now_ms())
        self.program = load_program(model_path, flag)
        names = set(self.program.method_names)
        # kv_method: what eval_mode 0 runs, v1.0.1's `forward` or v1.4.1's `kv_forward` (runner.cpp
        # v1.4.1:165-169), whichever release the runner is (farm/runner/releases.py)
        methods = (kv_method, kv_method) if eval_mode == EvalMode.KV.number else METHODS[eval_mode]
        # The layout is the program's: 1.4.1's (one cache per layer, farm/runner/io_v14.py), whose
        # methods are 1.4.1's whatever the release, or v1.0.1's.
        self.v14 = io_v14.is_v14(self.program)
        if self.v14:
            methods = io_v14.METHODS[eval_mode]
        if missing := [m for m in methods if m not in names]:
            raise UsageError(f"--model_path: {model_path} has no method {missing[0]!r} needed by "
                             f"--eval_mode {eval_mode} (it has: {', '.join(sorted(names))})")
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.template = (make_template(self.tokenizer) if make_template is not None
                         else PromptTemplate(self.tokenizer, decoder_model_version, upstream))
        prefill_name, decode_name = methods
        self.prefill = self.program.load_method(prefill_name)
        self.decode = self.program.load_method(decode_name)
        self.shape, self.vocab_size = self._read_shape(model_path)
        # --attention_sink_rope_path (runner.cpp v1.4.1:287-292): the evictor, for the methods this
        # mode runs; None without it (farm/runner/attention_sink.py).
        self.sink = None
        if attention_sink_rope_path:
            if not self.v14:
                raise UsageError(f"--attention_sink_rope_path: {model_path} is in v1.0.1's I/O layout; "
                                 "the attention sink is 1.4.1's (farm export --layout v1.4)")
            from farm.runner.attention_sink import FLAG, AttentionSink

            self.sink = AttentionSink(attention_sink_rope_path,
                                      load_program(attention_sink_rope_path, FLAG),
                                      {prefill_name: self.prefill, decode_name: self.decode})
        ar_len = io_v14.ar_len if self.v14 else (lambda m: m.metadata.input_tensor_meta(0).sizes()[1])
        self.prefill_ar, self.decode_ar = ar_len(self.prefill), ar_len(self.decode)
        self.lookahead = None
        if eval_mode == LOOKAHEAD:
            cfg = lookahead or LookaheadConfig(0, 0, 0)
            cfg.check(self.decode_ar, model_path)
            self.lookahead = LookaheadState(cfg, seed)
        elif self.decode_ar != 1:
            raise UsageError(f"--model_path: method {decode_name!r} has ar_len {self.decode_ar}, "
                             "expected 1")
        self.eval_mode = eval_mode
        if self.v14:
            io_mgr_cls = io_v14.updater_for(io_mgr_cls)
        self.io = io_mgr_cls(self.shape, [self.prefill_ar, self.decode_ar])
        self.delay_s = _runner_delay_s()
        # The clock the stats read: the host's, or a simulated phone's (farm/runner/timing.py), set
        # per generate call by whoever runs the runner.
        self.clock = WallClock()
        # --dump_logits_path: every step's whole logits output, kept for the runner's life as
        # upstream keeps them (farm/runner/logits.py has the layout); None when not dumping.
        self.prefill_logits: list[np.ndarray] | None = [] if dump_logits else None
        self.decode_logits: list[np.ndarray] | None = [] if dump_logits else None
        self.stats.model_load_end_ms = now_ms()

    def _read_shape(self, model_path: str) -> tuple[KVShape, int]:
        def const(name: str) -> int:
            if name not in self.program.method_names:
                raise UsageError(f"--model_path: {model_path} lacks metadata method {name!r}")
            return int(self.program.load_method(name).execute([])[0])

        meta = self.decode.metadata
        if self.v14:  # runner.cpp v1.4.1:221-249: from the token generator's shapes, n_layers metadata
            shape, vocab = io_v14.read_shape(self.program, meta, const("get_n_layers"))
            if wrong := io_v14.check_inputs(meta, shape, f"--model_path: {model_path}"):
                raise UsageError(wrong)
        else:
            shape = KVShape(n_layers=const("get_n_layers"), n_kv_heads=const("get_n_kv_heads"),
                            head_dim=const("get_head_dim"), max_seq_len=const("get_max_seq_len"))
            expected = 3 + 2 * shape.n_caches
            if meta.num_inputs() != expected:
                raise UsageError(f"--model_path: {model_path} has {meta.num_inputs()} inputs, the "
                                 f"static llama contract needs {expected}")
            vocab = const("get_vocab_size")
        if vocab != self.tokenizer.n_words:
            raise UsageError(f"--tokenizer_path: tokenizer has {self.tokenizer.n_words} tokens, "
                             f"the model's vocabulary is {vocab}")
        return shape, vocab

    @property
    def context_len(self) -> int:
        return self.shape.max_seq_len

    @property
    def cur_pos(self) -> int:
        """The absolute position (runner.cpp cur_pos_); the cache holds cur_pos - position_shift
        entries (shifted_pos), which is also the position the next step is fed at."""
        return self.io.n_past + (self.sink.position_shift if self.sink else 0)

    def max_prompt_len(self) -> int:
        # Prefill writes its entries into the prefill method's cache (max_seq_len - ar_len entries).
        return self.shape.max_seq_len - self.prefill_ar

    def clamp_seq_len(self, seq_len: int) -> int:
        """runner.cpp: a --seq_len outside 1..context length means the context length; with the
        attention sink only one below 1 does (runner.cpp v1.4.1:393-409)."""
        if self.sink is not None and seq_len > 0:
            return seq_len
        return seq_len if 0 < seq_len <= self.context_len else self.context_len

    def generate(self, prompt: str, seq_len: int, temperature: float, gen: torch.Generator,
                 tokens: list[int] | None = None) -> Generation:
        """One prompt, as upstream's generate_from_prompt_or_file: ``prompt`` is the formatted string
        (or, with ``tokens``, the --tokenized_prompt path, echoed as it is)."""
        if temperature < 0:
            raise UsageError(f"--temperature: must be >= 0, got {temperature}")
        seq_len = self.clamp_seq_len(seq_len)
        stats = self.stats
        clock = self.clock
        stats.inference_start_ms = clock.now_ms()
        start_pos = self.cur_pos
        ids = tokens if tokens is not None else self.template.encode(prompt, bos=start_pos == 0)
        if not ids:
            raise UsageError("--prompt: Expected at least 1 prompt token")
        if start_pos + len(ids) >= seq_len:
            raise UsageError(f"--seq_len: sequence length exceeded - please increase the seq_len value "
                             f"({start_pos} tokens before this prompt, {len(ids)} in it, --seq_len "
                             f"{seq_len}, context {self.context_len})")
        # prompt_processor.cpp v1.4.1:249-260: checked only without the attention sink.
        if self.sink is None and start_pos + len(ids) > self.max_prompt_len():
            raise UsageError(f"--prompt: The sequence length exceeds the maximum limit that the prompt "
                             f"processor can handle ({start_pos} + {len(ids)} tokens; the "
                             f"{EvalMode.from_number(self.eval_mode)} method takes at most "
                             f"{self.max_prompt_len()}, context {self.context_len})")
        text = bytearray(prompt.encode("utf-8", "surrogateescape"))
        if self.sink is not None:  # a full decode cache into the prefill's (then evicted), KVM:284-294
            self.io.switch_method_past_context(self.prefill_ar)
        else:
            self.io.switch_method(self.prefill_ar)
        # The prefill's token is sampled outside the stats' sampling timer (prompt_processor.cpp:341;
        # only the generators' loops time theirs, TOK:295-298, LHD:327-330), and decoded after
        # itself: decode(cur_token, cur_token), runner.cpp:430-431.
        token = pick(self._prefill(ids), temperature, gen)
        clock.prefill(len(ids))
        stats.first_token_ms = stats.prompt_eval_end_ms = clock.now_ms()
        generated = [token]
        text += self.template.piece(token, token)
        self.io.switch_method(self.decode_ar)
        if self.lookahead is not None:
            n_generated, reached_eos, newlines = self._lookahead_loop(
                ids, token, seq_len, temperature, gen, generated, text)
            return self._finish(ids, generated, text, n_generated, reached_eos, newlines)
        reached_eos = self.decode_loop(token, seq_len, temperature, gen, generated, text)
        return self._finish(ids, generated, text, self.cur_pos - start_pos - len(ids), reached_eos,
                            int(reached_eos))

    def decode_loop(self, token: int, seq_len: int, temperature: float, gen: torch.Generator,
                    generated: list[int], text: bytearray) -> bool:
        """The token generator's loop from the prefill's ``token``: each sampled token appended to
        ``generated`` and its piece to ``text``; whether it ended at an end token.
        token_generator.cpp: EOS is looked for only in what the loop samples, never in the token
        prefill produced; the loop's last token is written but not fed, so the next prompt starts
        where this one's last step ended."""
        while self.cur_pos < seq_len - 1:
            prev, token = token, self._sample(self._step(self.decode, [token], self.decode_logits),
                                              temperature, gen, self.stats)
            self.clock.decode()
            generated.append(token)
            text += self.template.piece(token, prev)  # decode(prev_token, cur_token), TOK:316-317
            if self.delay_s:
                time.sleep(self.delay_s)
            if token in self.template.eos_ids:
                return True
        return False

    def _finish(self, ids: list[int], generated: list[int], text: bytearray, n_generated: int,
                reached_eos: bool, newlines: int) -> Generation:
        stats = self.stats
        stats.inference_end_ms = self.clock.now_ms()
        stats.prompt_tokens = len(ids)
        stats.generated_tokens = n_generated
        return Generation(prompt_ids=list(ids), generated_ids=generated, text=bytes(text),
                          stats=replace(stats), reached_eos=reached_eos, newlines=newlines)

    def _lookahead_loop(self, ids: list[int], token: int, seq_len: int, temperature: float,
                        gen: torch.Generator, generated: list[int], text: bytearray
                        ) -> tuple[int, bool, int]:
        """lhd_token_generator.cpp generate (LHD:183-396): returns (tokens generated, EOS reached,
        newlines printed); appends what it writes to ``generated`` and ``text``."""
        cfg, ar = self.lookahead.cfg, self.decode_ar
        start = self.cur_pos
        if self.io.n_past > self.io.cache_len:
            raise UsageError(f"--prompt: {start} cached tokens do not fit the lookahead method's cache "
                             f"of {self.io.cache_len} (context {self.context_len}, ar_len {ar})")
        self.io.set_step_block(cfg.block(ar, MASK_MIN))
        try:
            return self._lookahead_steps(ids, token, start, seq_len, temperature, gen, generated, text)
        finally:  # the next prompt's prefill may run on this mask (a prefill of the same ar_len)
            self.io.set_step_block(causal_block(ar))

    def _lookahead_steps(self, ids: list[int], token: int, start: int, seq_len: int,
                         temperature: float, gen: torch.Generator, generated: list[int],
                         text: bytearray) -> tuple[int, bool, int]:
        state, cfg, ar = self.lookahead, self.lookahead.cfg, self.decode_ar
        pos = start
        state.init_branch([*ids, token])
        while pos < seq_len - 1:
            if self.sink is not None and self.sink.needs_room(self.io.n_past, cfg.ngram,
                                                              self.context_len, ar):
                self._evict(self.decode)  # LHD:255-263, then its own mask block again
                self.io.set_step_block(cfg.block(ar, MASK_MIN))
            checks = state.verification(token)
            # Fed at shifted positions (LHD:266-285): the absolute one less the evictions' shift.
            tokens, positions = state.step_inputs(token, self.io.n_past, checks)
            logits, outputs = self._lookahead_step(tokens, positions)
            self.clock.decode()
            state.steps += 1
            selected, reached_eos = [], False
            row = 0
            for v in range(cfg.ngram):
                if v > 0:  # the first n-gram still matching everything sampled so far
                    g = next((g for g, c in enumerate(checks) if c.active), None)
                    if g is None:
                        break
                    row = state.row_of(g, v)
                    state.accepted += 1
                selected.append(row)
                prev, token = token, self._sample(logits[row], temperature, gen, self.stats)
                generated.append(token)
                text += self.template.piece(token, prev)  # LHD:325-336
                pos += 1
                if token in self.template.eos_ids:
                    reached_eos = True
                    break
                for c in checks:
                    c.active = c.active and v < cfg.ngram - 1 and token == c.tokens[v + 1]
                if v == 0:
                    last = (cfg.ngram - 2) * cfg.window
                    state.advance([pick(logits[last + i], temperature, gen) for i in range(cfg.window)])
            if self.delay_s:
                time.sleep(self.delay_s * len(selected))
            if self.sink is None and pos > self.context_len - ar:
                return pos - start, reached_eos, 1 + int(reached_eos)  # LHD:368-372, not cached
            self._keep_rows(outputs, selected)
            if reached_eos:
                return pos - start, True, 2
        return pos - start, False, 0

    def _lookahead_step(self, tokens: list[int], positions: list[int]):
        inputs = self.io.inputs(tokens, self.io.n_past, positions)
        outputs = self.decode.execute(inputs)
        logits = outputs[0].numpy()[0]
        if self.decode_logits is not None:
            self.decode_logits.append(logits.copy())
        return logits, outputs

    def _keep_rows(self, outputs, rows: list[int]) -> None:
        """Cache the K/V entries of the rows sampled, in order (kv_manager.cpp update_cache with
        ``selected``): they become the next positions."""
        if self.v14:
            return self.io.keep_rows(outputs, rows)
        m = self.shape.n_caches
        index = torch.tensor(rows)
        new_k = [k.index_select(2, index) for k in outputs[1 : 1 + m]]
        new_v = [v.index_select(1, index) for v in outputs[1 + m : 1 + 2 * m]]
        self.io.update([outputs[0], *new_k, *new_v], len(rows))

    def complete(self, prompt: str, seq_len: int, temperature: float = 0.0, seed: int = 0,
                 system_prompt: str = "") -> Generation:
        """A fresh conversation of one prompt (position 0 again), for callers in this process that
        reuse one loaded runner: upstream has one runner per process, so it never needs this."""
        self.io.reset()
        return self.generate(self.template.format(prompt, system_prompt), seq_len, temperature,
                             torch.Generator().manual_seed(seed))

    def _prefill(self, ids: list[int]) -> np.ndarray:
        logits = None
        for start in range(0, len(ids), self.prefill_ar):
            logits = self._step(self.prefill, ids[start : start + self.prefill_ar], self.prefill_logits)
        return logits

    def logits_dump(self) -> bytes:
        """What --dump_logits_path holds after this call: all prefill rows, then all decode rows."""
        from farm.runner.logits import dump_bytes

        return dump_bytes(self.prefill_logits or [], self.decode_logits or [])

    def _step(self, method, tokens: list[int], keep: list[np.ndarray] | None = None) -> np.ndarray:
        """Run one step; returns the logits of the step's last valid token. ``keep``: a list to
        append the step's whole logits output to ([ar_len, vocab], padding rows included)."""
        if self.sink is not None and self.sink.needs_room(self.io.n_past, self.io.ar_len,
                                                          self.context_len, self.io.ar_len):
            self._evict(method)  # PP:314-332, TG:278-296
        try:
            inputs = self.io.inputs(tokens, self.io.n_past)
        except ContextFull as e:
            raise UsageError(f"--seq_len: context exhausted: {e}") from None
        outputs = method.execute(inputs)
        if keep is not None:
            keep.append(outputs[0].numpy()[0].copy())
        self.io.update(outputs, len(tokens))
        # A numpy view of the row: indexing and argmax cost ~1 us there, ~4 us through torch's
        # dispatcher, on every decoded token (bench/bench_runner_tokens.py).
        return outputs[0].numpy()[0, len(tokens) - 1]

    def _evict(self, method) -> None:
        """The evictor's method of the decoder method about to run, on its caches; shifted_pos less
        the batch, the mask initialised there (attention_sink_rope_runner.cpp:56-66, TG:281-286)."""
        self.sink.evict(method.metadata.name(), self.io.caches())
        self.io.evicted(self.sink.eviction_batch_size)

    def _sample(self, logits: np.ndarray, temperature: float, gen: torch.Generator, stats: Stats) -> int:
        start = self.clock.now_ms()
        token = pick(logits, temperature, gen)
        stats.aggregate_sampling_time_ms += self.clock.now_ms() - start
        return token


def pick(logits: np.ndarray, temperature: float, gen: torch.Generator) -> int:
    if temperature == 0:
        return int(logits.argmax())  # the first maximum, as torch.argmax
    probs = torch.softmax(torch.from_numpy(logits).double() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


def _runner_delay_s() -> float:
    """A virtual device's throttle (fault ``runner_delay_ms``): seconds to sleep per decoded token, so
    that a slowed phone can be imitated. Never set outside virtual devices."""
    raw = os.environ.get("PTEFARM_RUNNER_DELAY_MS", "")
    try:
        return max(0.0, float(raw) / 1000.0) if raw else 0.0
    except ValueError:
        raise UsageError(f"PTEFARM_RUNNER_DELAY_MS: not a number: {raw!r}") from None


def import_runtime():
    """executorch.runtime, without importing the exporter.

    The runtime's pybindings import `executorch.exir._warnings` only for a warning class, and importing it
    the normal way runs `executorch/exir/__init__.py`, the whole exporter (dynamo, passes): seconds of
    start-up on every run of the runner, i.e. of every test case on a device. A bare package module
    stands in for `executorch.exir` while the runtime imports, so only `_warnings.py` runs. Should a
    future release need more of exir at import, the plain import is the fallback.
    """
    import importlib
    import sys
    import types

    if "executorch.runtime" in sys.modules or "executorch.exir" in sys.modules:
        return importlib.import_module("executorch.runtime")
    import executorch

    stand_in = types.ModuleType("executorch.exir")
    stand_in.__path__ = [str(Path(executorch.__path__[0]) / "exir")]
    sys.modules["executorch.exir"] = stand_in
    try:
        return importlib.import_module("executorch.runtime")
    except ImportError:
        for name in [n for n in sys.modules if n.startswith(("executorch.exir", "executorch.runtime",
                                                              "executorch.extension.pybindings"))]:
            del sys.modules[name]
        return importlib.import_module("executorch.runtime")
    finally:
        if sys.modules.get("executorch.exir") is stand_in:
            del sys.modules["executorch.exir"]


def load_program(model_path: str, flag: str = "--model_path"):
    Runtime = import_runtime().Runtime

    p = Path(model_path)
    if not p.is_file():
        raise UsageError(f"{flag}: {p} does not exist")
    try:
        return Runtime.get().load_program(p)
    except Exception as e:  # the runtime raises RuntimeError/ValueError with its own error codes
        raise UsageError(f"{flag}: {p} is not a loadable .pte program "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})") \
            from None


def updater_class(name: str) -> type[IoMgr]:
    if name not in UPDATERS:
        raise UsageError(f"--kv_updater: unknown updater {name!r} (known: {', '.join(UPDATERS)})")
    return UPDATERS[name]
