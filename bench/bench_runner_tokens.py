#!/usr/bin/env python3
"""Host runner per decoded token: time in the model's execute vs the I/O manager and Python around it.

    python bench/bench_runner_tokens.py                       # tiny and small, kv and hybrid, both updaters
    python bench/bench_runner_tokens.py --configs small --modes hybrid --repeats 1 --profile /tmp/p.prof

For each config, model context (``--contexts``: the exported max_seq_len, i.e. the cache every step
attends over; `small` is exported at 4096, its 512 variant is exported once into the export cache) and
mode, SmartMask and ShiftPointer run the same greedy generation of ``--tokens`` tokens through the real
engine (farm/runner/engine.py) on a real .pte, interleaved (SM, SP, SM, SP, ...) so that machine noise
hits both alike. The graphs are static, so a step costs the same at any position: the context, not
how far a generation got, sets a token's cost. Every decode step is timed in three parts:
- execute: inside the program's ``execute`` (the model; on a phone, the HTP);
- io: the I/O manager (``inputs`` building the step's tensors, ``update`` storing the new K/V entries);
- other: the rest of the token's time (sampling, the engine's loop, decoding the piece).
A token's time runs from the start of one decode step to the start of the next (the last one to the
end of generate). Per row: medians over the repeats of per-token means; `outside %` = (io + other) /
token; tok/s = decoded tokens / decode time. Bundles come from the export cache (`farm export`).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.bundle import manifest as bundle_mod  # noqa: E402
from farm.bundle.export import export_bundle, export_config  # noqa: E402
from farm.model.config import CONFIGS  # noqa: E402
from farm.runner.engine import LlamaRunner  # noqa: E402
from farm.runner.io_manager import UPDATERS  # noqa: E402

PROMPT = "Once upon a time, there was a little girl named Lily."
TARGET_OUTSIDE = 0.10  # of a token's time, for `small`


@dataclass
class Timings:
    """Per decode step: (step start, execute s, io s); and the end of the generation."""

    steps: list[tuple[float, float, float]] = field(default_factory=list)
    end: float = 0.0

    def per_token(self) -> dict[str, float]:
        starts = [s[0] for s in self.steps] + [self.end]
        total = sum(b - a for a, b in zip(starts, starts[1:]))
        n = len(self.steps)
        execute = sum(s[1] for s in self.steps)
        io = sum(s[2] for s in self.steps)
        return {"token_ms": 1000 * total / n, "execute_ms": 1000 * execute / n,
                "io_ms": 1000 * io / n, "other_ms": 1000 * (total - execute - io) / n,
                "tok_s": n / total, "n": n}


class TimedMethod:
    """Stands in for a loaded method: times ``execute`` of decode steps."""

    def __init__(self, method: Any, probe: Probe, decode: bool):
        self._method, self._probe, self._decode = method, probe, decode

    def execute(self, inputs: list) -> Any:
        t0 = time.perf_counter()
        out = self._method.execute(inputs)
        self._probe.executed(self._decode, time.perf_counter() - t0)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._method, name)


class Probe:
    """Wraps a runner's methods and I/O manager, without changing the engine, to time each step."""

    def __init__(self, runner: LlamaRunner):
        self.timings = Timings()
        self._pending: tuple[float, float] | None = None  # this step's start and io time so far
        self._last: tuple[float, float, float] | None = None
        io = runner.io
        inputs, update = io.inputs, io.update

        def timed_inputs(tokens: list[int], start_pos: int) -> list:
            t0 = time.perf_counter()
            result = inputs(tokens, start_pos)
            self._pending = (t0, time.perf_counter() - t0)
            return result

        def timed_update(outputs: list, n: int) -> None:
            t0 = time.perf_counter()
            update(outputs, n)
            if self._last is not None:
                start, execute, io_s = self._last
                self.timings.steps.append((start, execute, io_s + time.perf_counter() - t0))
                self._last = None

        io.inputs, io.update = timed_inputs, timed_update  # type: ignore[method-assign]
        runner.decode = TimedMethod(runner.decode, self, decode=True)
        runner.prefill = TimedMethod(runner.prefill, self, decode=False)

    def executed(self, decode: bool, seconds: float) -> None:
        assert self._pending is not None
        start, io_s = self._pending
        self._pending = None
        self._last = (start, seconds, io_s) if decode else None


def bundle_with_context(name: str, context: int) -> Path:
    """The manifest of config ``name`` with a context (max_seq_len) of ``context``: the named config's
    own bundle when that is its context, else a variant exported once into the same cache, keyed
    by its config like every bundle there. (Written here by hand because ``export_bundle`` takes
    only the names of farm/model/config.py; the variant has the same layers, only a shorter cache.)"""
    cfg = CONFIGS[name]
    if context == cfg.max_seq_len:
        return export_bundle(name)
    cfg = replace(cfg, name=f"{name}-ctx{context}", max_seq_len=context,
                  prefill_ar_len=min(cfg.prefill_ar_len, context // 2))
    return export_config(cfg, on_step=lambda what, step, steps: print(
        f"# exporting {cfg.name} (once; minutes on a busy 2-core host): {step}/{steps} {what}",
        flush=True))


def runner_for(manifest: Path, mode: str, updater: str) -> LlamaRunner:
    b = bundle_mod.load(manifest)
    files = {f.name: str(f.path) for f in b.files}
    return LlamaRunner(files[b.modes[mode].pte], files[b.tokenizer], b.modes[mode].eval_mode,
                       UPDATERS[updater], "llama3")


def measure(runner: LlamaRunner, seq_len: int) -> tuple[dict[str, float], list[int]]:
    probe = Probe(runner)
    gen = runner.complete(PROMPT, seq_len)
    probe.timings.end = time.perf_counter()
    # Unwrap (the next measurement wraps afresh).
    runner.decode, runner.prefill = runner.decode._method, runner.prefill._method
    del runner.io.inputs, runner.io.update
    return probe.timings.per_token(), gen.generated_ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="tiny,small")
    ap.add_argument("--modes", default="kv,hybrid")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--contexts", default="tiny=128,small=512:4096",
                    help="per config, the model contexts (max_seq_len) to measure, short:long")
    ap.add_argument("--tokens", type=int, default=128, help="tokens to decode per generation")
    ap.add_argument("--profile", help="write a cProfile of the measured generations here")
    args = ap.parse_args()
    contexts = {c: tuple(int(x) for x in v.split(":"))
                for c, v in (item.split("=") for item in args.contexts.split(","))}
    profiler = cProfile.Profile() if args.profile else None
    torch_threads = __import__("torch").get_num_threads()
    print(f"# {os.cpu_count()} CPUs, torch threads {torch_threads}, load {os.getloadavg()[0]:.1f}, "
          f"{args.repeats} repeats of {args.tokens} decoded tokens, per token (medians)")
    print(f"{'config':6} {'mode':6} {'ctx':>5} {'upd':5} | {'token ms':>8} {'execute':>8} {'io':>7} "
          f"{'other':>7} {'outside%':>8} | {'tok/s':>7} {'n':>4}")
    summary: list[str] = []
    worst_small = 0.0
    for name in args.configs.split(","):
        for context in contexts[name]:
            manifest = bundle_with_context(name, context)
            for mode in args.modes.split(","):
                runners = {u: runner_for(manifest, mode, u) for u in UPDATERS}
                prompt_len = len(next(iter(runners.values())).template.encode_turn(PROMPT, "", True))
                seq_len = min(context, prompt_len + args.tokens + 1)
                for r in runners.values():  # warm-up, untimed
                    measure(r, min(seq_len, prompt_len + 16))
                results: dict[str, list[dict[str, float]]] = {u: [] for u in runners}
                tokens = {}
                for _ in range(args.repeats):
                    for u, r in runners.items():
                        if profiler:
                            profiler.enable()
                        figures, tokens[u] = measure(r, seq_len)
                        if profiler:
                            profiler.disable()
                        results[u].append(figures)
                med = {u: {k: statistics.median(f[k] for f in fs) for k in fs[0]}
                       for u, fs in results.items()}
                for u, m in med.items():
                    outside = (m["io_ms"] + m["other_ms"]) / m["token_ms"]
                    if name == "small":
                        worst_small = max(worst_small, outside)
                    print(f"{name:6} {mode:6} {context:>5} {u[:5]:5} | {m['token_ms']:>8.3f} "
                          f"{m['execute_ms']:>8.3f} {m['io_ms']:>7.3f} {m['other_ms']:>7.3f} "
                          f"{100 * outside:>8.1f} | {m['tok_s']:>7.1f} {m['n']:>4.0f}", flush=True)
                sm, sp = med["SmartMask"], med["ShiftPointer"]
                same = tokens["SmartMask"] == tokens["ShiftPointer"]
                summary.append(f"{name}/{mode}/{context} SM/SP x{sm['tok_s'] / sp['tok_s']:.2f}"
                               f"{'' if same else ' (tokens differ!)'}")
    if profiler:
        profiler.dump_stats(args.profile)
    verdict = (f"small: worst outside-execute share {100 * worst_small:.1f} % "
               f"(target < {100 * TARGET_OUTSIDE:.0f} %)") if worst_small else "small not measured"
    print(f"summary: {verdict}; tok/s {'; '.join(summary)}")
    return 0 if worst_small < TARGET_OUTSIDE else 1


if __name__ == "__main__":
    sys.exit(main())
