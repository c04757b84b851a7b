"""Tokens/second of the SmartMask and ShiftPointer updaters, side by side, on the host runner.

    python bench/bench_updaters.py [--configs tiny,small] [--repeats 3] [--long-small 4096]

For each config, mode (kv, hybrid) and context (short, long) both updaters run the same greedy
generation, interleaved (SM, SP, SM, SP, ...) so that machine noise hits both alike; the median of the
repeats is printed with the SmartMask/ShiftPointer ratio and whether the tokens were identical.
`overall` is upstream's inference_speed.txt figure (generated tokens over the whole inference, prefill
included); `decode` is generated tokens after the first over first_token..inference_end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.bundle import manifest as bundle_mod  # noqa: E402
from farm.bundle.export import export_bundle  # noqa: E402
from farm.runner.engine import LlamaRunner  # noqa: E402
from farm.runner.io_manager import UPDATERS  # noqa: E402

PROMPT = "Once upon a time, there was a little girl named Lily."


def runner_for(manifest: Path, mode: str, updater: str) -> LlamaRunner:
    b = bundle_mod.load(manifest)
    files = {f.name: str(f.path) for f in b.files}
    return LlamaRunner(files[b.modes[mode].pte], files[b.tokenizer], b.modes[mode].eval_mode,
                       UPDATERS[updater], "llama3")


def measure(runner: LlamaRunner, seq_len: int) -> tuple[float, float, list[int]]:
    gen = runner.complete(PROMPT, seq_len)
    s = gen.stats
    decode_s = max(s.inference_end_ms - s.first_token_ms, 1) / 1000
    return s.tokens_per_second(), s.generated_tokens / decode_s, gen.generated_ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="tiny,small")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--long-small", type=int, default=4096, help="long context of `small`")
    args = ap.parse_args()
    contexts = {"tiny": {"short": 64, "long": 128}, "small": {"short": 256, "long": args.long_small}}
    print(f"{'config':6} {'mode':6} {'ctx':>5} | {'SM overall':>10} {'SP overall':>10} {'SM/SP':>6} | "
          f"{'SM decode':>9} {'SP decode':>9} {'SM/SP':>6} | same tokens")
    ratios: list[str] = []
    all_same = True
    for name in args.configs.split(","):
        t0 = time.monotonic()
        manifest = export_bundle(name)
        print(f"# {name}: bundle {manifest} ({time.monotonic() - t0:.1f}s to export or find)",
              flush=True)
        for mode in ("kv", "hybrid"):
            runners = {u: runner_for(manifest, mode, u) for u in UPDATERS}
            for ctx_name, seq_len in contexts[name].items():
                overall = {u: [] for u in runners}
                decode = {u: [] for u in runners}
                tokens = {}
                for u, r in runners.items():  # warm-up, untimed
                    measure(r, min(seq_len, 96))
                for _ in range(args.repeats):
                    for u, r in runners.items():
                        o, d, ids = measure(r, seq_len)
                        overall[u].append(o)
                        decode[u].append(d)
                        tokens[u] = ids
                med = {u: (statistics.median(overall[u]), statistics.median(decode[u]))
                       for u in runners}
                sm, sp = med["SmartMask"], med["ShiftPointer"]
                same = tokens["SmartMask"] == tokens["ShiftPointer"]
                print(f"{name:6} {mode:6} {seq_len:>5} | {sm[0]:>10.1f} {sp[0]:>10.1f} "
                      f"{sm[0] / sp[0]:>6.2f} | {sm[1]:>9.1f} {sp[1]:>9.1f} {sm[1] / sp[1]:>6.2f} | "
                      f"{same}", flush=True)
                ratios.append(f"{name}/{mode}/{seq_len} x{sm[0] / sp[0]:.2f}")
                all_same = all_same and same
    print(f"summary: SmartMask/ShiftPointer tok/s {', '.join(ratios)}; "
          f"same tokens everywhere: {all_same}")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
