"""Chunked deploy against a plain push of the same changed files, on a virtual device.

    python bench/bench_delta_deploy.py [--rounds 3] [--mbps 35] [--cache DIR]

The programs are real ExecuTorch exports of one reference llama (dim 512, 8 layers, ~99 MB of fp32
weights in each program), built by this bench with the farm's exporter and cached in ``--cache``
(default ``$PTEFARM_HOME/bench-delta``; about five minutes the first time):

- ``kv``: the kv program (the base: what the device holds before each case);
- ``hybrid``: the bundle's second program (prefill + kv methods over the same weights);
- ``kv, context 256``: a rebuild with a changed graph: max_seq_len 128 -> 256 (cache and mask
  shapes, rope tables, the metadata methods), the same weights;
- ``kv, 5 % of weights``: a rebuild with whole tensors re-drawn, 5 % of the weight bytes;
- ``hybrid, context 256``: the second program rebuilt the same way, for the case of a whole bundle
  rebuilt (both programs, the device holding both before: their files are assembled side by side).

Each case, each round, on both links (unthrottled, and the virtual device's link fault at ``--mbps``
MB/s, a phone's USB 2):

- chunked: the device emptied, the base deployed (its chunks fill the store), then the case's bundle
  deployed with chunking on, timed;
- plain: the device emptied, the base deployed whole, then the case's bundle deployed whole, timed
  (what today's deploy and upstream's push cost: the changed file, all of it).

Before each timed deploy the process forgets every digest and chunk list it knows, so each deploy
reads its files as a new build's deploy does (chunking, hashing); no verify runs first. Bytes pushed
are the deploy report's (bytes sent over the link); wall is the deploy call. Ratios are medians over
the rounds. Ends with one summary line; targets: second program <= 15 % of its bytes, rebuild <= 5 %,
rebuild wall at the throttled link <= 0.15 of a full push.
"""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MB = 1_000_000
TARGET_SECOND, TARGET_REBUILD, TARGET_WALL = 0.15, 0.05, 0.15
KV, HYBRID, CTX256, W5 = "kv", "hybrid", "kv, context 256", "kv, 5 % of weights"
HYBRID_CTX256 = "hybrid, context 256"
FILE = {KV: "kv_llama_xnnpack.pte", HYBRID: "hybrid_llama_xnnpack.pte"}


def _config():
    from farm.model.config import LlamaConfig

    return LlamaConfig(name="delta-bench", dim=512, n_layers=8, n_heads=8, n_kv_heads=2,
                       hidden_dim=1536, max_seq_len=128, prefill_ar_len=16, vocab_size=512,
                       n_base_tokens=500, seed=77)


def build_programs(cache: Path) -> dict[str, Path]:
    """The four programs, exported once into ``cache`` (each written to a temp name, then renamed)."""
    paths = {KV: cache / "kv.pte", HYBRID: cache / "hybrid.pte", CTX256: cache / "kv-ctx256.pte",
             W5: cache / "kv-w5.pte", HYBRID_CTX256: cache / "hybrid-ctx256.pte"}
    if all(p.is_file() for p in paths.values()):
        return paths
    import torch

    from farm.bundle.export import _lower, _metadata_methods
    from farm.model.llama import LlamaWeights, StaticLlama

    cache.mkdir(parents=True, exist_ok=True)
    cfg = _config()
    weights = LlamaWeights(cfg).eval()
    ctx = replace(cfg, max_seq_len=256)
    weights_ctx = LlamaWeights(ctx).eval()  # the same seed and shapes: the same weights
    weights_w5 = _redraw(copy.deepcopy(weights), 0.05)
    jobs = {KV: lambda: ({"forward": StaticLlama(weights, 1)}, cfg),
            HYBRID: lambda: ({"prefill_forward": StaticLlama(weights, cfg.prefill_ar_len),
                              "kv_forward": StaticLlama(weights, 1)}, cfg),
            CTX256: lambda: ({"forward": StaticLlama(weights_ctx, 1)}, ctx),
            W5: lambda: ({"forward": StaticLlama(weights_w5, 1)}, cfg),
            HYBRID_CTX256: lambda: ({"prefill_forward": StaticLlama(weights_ctx, cfg.prefill_ar_len),
                                     "kv_forward": StaticLlama(weights_ctx, 1)}, ctx)}
    with torch.no_grad():
        for case, job in jobs.items():
            if paths[case].is_file():
                continue
            print(f"exporting {case} ...", flush=True)
            methods, c = job()
            tmp = paths[case].with_suffix(".tmp")
            _lower(methods, _metadata_methods(c), tmp)
            os.replace(tmp, paths[case])
    return paths


def synthetic_programs(root: Path, mb: int) -> dict[str, Path]:
    """Random bytes shaped like the four cases (``--synthetic``: seconds, not minutes; for the test
    that runs every bench): a header before shared weights, an insertion and a rewritten header, and
    5 % of the bytes re-drawn in whole 256 KiB runs."""
    import random

    rnd = random.Random(7)
    root.mkdir(parents=True, exist_ok=True)
    weights = rnd.randbytes(mb * MB)
    header = rnd.randbytes(64 * 1024)
    runs = list(range(0, len(weights) - (256 << 10), 256 << 10))
    w5 = bytearray(weights)
    for start in rnd.sample(runs, max(1, int(0.05 * len(weights)) // (256 << 10))):
        w5[start:start + (256 << 10)] = rnd.randbytes(256 << 10)
    data = {KV: header + weights, HYBRID: rnd.randbytes(96 * 1024) + weights,
            CTX256: rnd.randbytes(64 * 1024) + weights[:len(weights) // 2] + rnd.randbytes(4096)
            + weights[len(weights) // 2:],
            W5: header + bytes(w5),
            HYBRID_CTX256: rnd.randbytes(96 * 1024) + weights[:len(weights) // 3] + rnd.randbytes(4096)
            + weights[len(weights) // 3:]}
    paths = {}
    for case, body in data.items():
        paths[case] = root / (case.replace(" ", "").replace(",", "-").replace("%", "pct") + ".bin")
        paths[case].write_bytes(body)
    return paths


def _redraw(weights, fraction: float):
    """Re-draw whole weight matrices, last layers first, until ``fraction`` of the bytes changed (a
    fine-tune of the top layers, as a PR that retrains part of a model gives)."""
    import torch

    params = [p for _, p in weights.named_parameters() if p.dim() == 2]
    total = sum(p.numel() for _, p in weights.named_parameters())
    changed = 0
    gen = torch.Generator().manual_seed(99)
    for p in reversed(params):
        if changed + p.numel() > fraction * total:
            continue
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=gen) * p.std())
        changed += p.numel()
    print(f"5 % case: {changed / total:.1%} of the weights re-drawn", flush=True)
    return weights


def _bundle(root: Path, files: dict[str, Path]):
    from farm.bundle.manifest import Bundle, Mode, describe_file

    root.mkdir(parents=True, exist_ok=True)
    described = []
    for name, src in files.items():
        dst = root / name
        os.link(src, dst)
        described.append(describe_file(root, dst, role="pte", name=name))
    first = next(iter(files))
    return Bundle(name="delta-bench", runner_dialect="host", tokenizer=first, files=described,
                  modes={"kv": Mode(first, 0, 1)})


def _forget() -> None:
    from farm.bundle import manifest
    from farm.execute import chunking

    with manifest._digest_lock:
        manifest._digest_cache.clear()
    chunking.forget()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mbps", type=float, default=35.0, help="the throttled link, MB/s")
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--synthetic", type=int, metavar="MB", default=None,
                    help="random files of MB megabytes instead of exported programs, chunked from "
                         "1 MiB (a quick run that takes every code path; its figures are not the "
                         "targets')")
    args = ap.parse_args()

    from farm.config import farm_home
    from farm.device.discovery import find_device
    from farm.execute.chunking import PLAIN, ChunkPolicy
    from farm.execute.chunkstore import store_dir
    from farm.execute.deploy import deploy
    from farm.virtual import VirtualDeviceSpec, VirtualFarm

    synthetic_dir = tempfile.TemporaryDirectory(prefix="bench-delta-synthetic-")
    if args.synthetic:
        programs = synthetic_programs(Path(synthetic_dir.name), args.synthetic)
        chunked = ChunkPolicy(min_file_bytes=1 << 20)
        print(f"synthetic: random files of {args.synthetic} MB, not exported programs")
    else:
        programs = build_programs(args.cache or farm_home() / "bench-delta")
        chunked = ChunkPolicy()
    sizes = {case: p.stat().st_size for case, p in programs.items()}
    print("programs: " + ", ".join(f"{c} {s / MB:.1f} MB" for c, s in sizes.items()))
    print(f"chunks: {chunked.min_chunk >> 10}-{chunked.avg_chunk >> 10}-{chunked.max_chunk >> 10} KiB "
          f"(min-avg-max), files from {chunked.min_file_bytes >> 20} MiB")

    with tempfile.TemporaryDirectory(prefix="bench-delta-") as tmp_s:
        tmp = Path(tmp_s)
        base = _bundle(tmp / "base", {FILE[KV]: programs[KV]})
        both = _bundle(tmp / "base2", {FILE[KV]: programs[KV], FILE[HYBRID]: programs[HYBRID]})
        # case -> (what the device holds first, the bundle deployed then, the programs that changed)
        cases = {
            "second program": (base, _bundle(tmp / "a", {FILE[KV]: programs[KV],
                                                         FILE[HYBRID]: programs[HYBRID]}), [HYBRID]),
            "rebuild, changed graph": (base, _bundle(tmp / "b", {FILE[KV]: programs[CTX256]}),
                                       [CTX256]),
            "rebuild, 5 % of weights": (base, _bundle(tmp / "c", {FILE[KV]: programs[W5]}), [W5]),
            "bundle rebuilt, graph": (both, _bundle(tmp / "d", {FILE[KV]: programs[CTX256],
                                                                FILE[HYBRID]: programs[HYBRID_CTX256]}),
                                      [CTX256, HYBRID_CTX256]),
        }
        with VirtualFarm(home=tmp / "farm") as vf:
            (dev,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
            device = find_device([vf.adb_server], dev.serial)
            wipe = shlex.join(["rm", "-rf", "--", f"{device.workspace}/{base.name}",
                               store_dir(device)])

            def timed(bundle, policy):
                _forget()
                t = time.perf_counter()
                report = deploy(device, bundle, chunking=policy, timeout=120)
                return time.perf_counter() - t, report

            results: dict[tuple[str, str], dict[str, list[float]]] = {}
            for link, rate in (("unthrottled", None), (f"{args.mbps:g} MB/s", int(args.mbps * MB))):
                if rate:
                    vf.set_faults(dev.serial, slow_bytes_per_s=rate)
                else:
                    vf.clear_faults(dev.serial)
                for _ in range(args.rounds):
                    for case, (first, bundle, changed) in cases.items():
                        row = results.setdefault((link, case), {"bytes": [], "wall": [],
                                                                "plain_wall": [], "cold": [],
                                                                "plain_cold": []})
                        device.shell(wipe, timeout=60, check=True)
                        cold, _ = timed(first, chunked)
                        wall, report = timed(bundle, chunked)
                        device.shell(wipe, timeout=60, check=True)
                        plain_cold, _ = timed(first, PLAIN)
                        plain_wall, plain = timed(bundle, PLAIN)
                        expected = sum(sizes[p] for p in changed)
                        assert plain.bytes_pushed == expected, (plain.bytes_pushed, changed)
                        for phase in ("chunking", "pushing", "assembling"):
                            row.setdefault(phase, []).append(report.chunks[f"seconds_{phase}"])
                        row.setdefault("chunked_wall", []).append(wall)
                        row["bytes"].append(report.bytes_pushed / plain.bytes_pushed)
                        row["wall"].append(wall / plain_wall)
                        row["plain_wall"].append(plain_wall)
                        row["cold"].append(cold)
                        row["plain_cold"].append(plain_cold)
            # The device's own hashing rate, which the device term of a chunked deploy scales with:
            # a phone's may differ (this is a virtual device, said in the output).
            held = shlex.quote(f"{device.workspace}/{base.name}/{FILE[KV]}")
            t = time.perf_counter()
            device.shell(f"sha256sum -- {held}", timeout=120, check=True)
            hash_rate = sizes[CTX256] / (time.perf_counter() - t)
            device.shell(wipe, timeout=60, check=True)

    med = statistics.median
    print(f"\n{'link':<12} {'case':<26} {'pushed':>8} {'wall':>7} {'plain push':>11} "
          f"{'cold, chunked / plain':>22}")
    for (link, case), row in results.items():
        print(f"{link:<12} {case:<26} {med(row['bytes']):>7.1%} {med(row['wall']):>6.3f}x "
              f"{med(row['plain_wall']):>10.2f}s "
              f"{med(c / p for c, p in zip(row['cold'], row['plain_cold'])):>21.2f}x")
    print("\nwhere a chunked deploy's time goes (medians): host = cutting and hashing the new "
          "files, push = the missing chunks, device = assembling and hashing the file on the device")
    for (link, case), row in results.items():
        w, h, p, dv = (med(row[k]) for k in ("chunked_wall", "chunking", "pushing", "assembling"))
        print(f"{link:<12} {case:<26} wall {w:.3f} s: host {h:.3f}, push {p:.3f}, device {dv:.3f}, "
              f"the rest (probe, record, renames) {w - h - p - dv:.3f}")
    print(f"device: a virtual SM8650 on this host; its sha256sum (toybox's, hashing with the CPU's "
          f"SHA instructions as a phone's does) ran at {hash_rate / MB:.0f} MB/s here, one shell "
          f"call included: the device term scales with a phone's own rate")
    throttled = f"{args.mbps:g} MB/s"
    a = med(results[(throttled, "second program")]["bytes"])
    b = med(results[(throttled, "rebuild, changed graph")]["bytes"])
    c = med(results[(throttled, "rebuild, 5 % of weights")]["bytes"])
    d = med(results[(throttled, "rebuild, changed graph")]["wall"])
    checks = [("second program", a, TARGET_SECOND), ("rebuild", b, TARGET_REBUILD),
              ("rebuild wall", d, TARGET_WALL)]
    print("targets: " + "; ".join(f"{n} {v:.3f} <= {t} {'met' if v <= t else 'MISSED'}"
                                  for n, v, t in checks))
    print(f"summary: second program pushed {a:.1%} of its bytes, rebuild {b:.1%}, "
          f"5 %-weights rebuild {c:.1%}; wall at {args.mbps:g} MB/s x{d:.3f} of a full push")
    synthetic_dir.cleanup()
    sys.exit(0 if all(v <= t for _, v, t in checks) else 1)


if __name__ == "__main__":
    main()
