"""farm-llama-runner start-up: in-process (imports torch every run) vs through a runner zygote.

    python bench/bench_runner_startup.py [--model tiny] [--repeats 5] [--target KEY=LIMIT]

Each run is the command a device test types (`farm-llama-runner --model_path ... --temperature 0`), a
real process started from here. Measured from the launch: `start-up` until the runner starts loading
the model (the PyTorchObserver line's model_load_start_ms), `first token` until first_token_ms, `exit`
until the process is gone. Both updaters; the in-process and zygote runs are interleaved (IP, Z, IP,
Z, ...) so that machine noise hits both alike; ratios are medians of per-pair ratios, quoted with
their spread (min-max) over the repeats. The zygote's own start-up (paid once per device) is printed
first. Target: through the zygote, the first token within 0.3 s of the launch (the median, of the
slower updater); a line says met or MISSED (``--target first_token=LIMIT`` sets it for a run) and the
bench exits 1 when it is missed. Ends with one summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import Spread, Target, add_target_option, judge, print_verdicts, targets_met  # noqa: E402
from benchlib import with_overrides  # noqa: E402
from farm import procs  # noqa: E402
from farm.bundle import manifest as bundle_mod  # noqa: E402
from farm.bundle.export import export_bundle  # noqa: E402
from farm.runner import zygote  # noqa: E402

UPDATERS = ("SmartMask", "ShiftPointer")
PATHS = ("in-process", "zygote")
METRICS = ("start-up", "first token", "exit")
TARGETS = (Target("first_token", "zygote first token median (slower updater)", "<", 0.3, " s"),)  # issue 13


def runner_command() -> list[str]:
    """The console script users type, from this interpreter's environment."""
    script = Path(sys.executable).parent / "farm-llama-runner"
    return [str(script)] if script.exists() else procs.module_argv("farm.runner.main")


def one_run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[dict[str, float], bytes]:
    """Seconds from launch to each metric, and the run's token ids."""
    launched_ms = time.time() * 1000  # the runner's stats are wall-clock ms
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    exit_s = time.perf_counter() - start
    if proc.returncode != 0 or "not answering" in proc.stderr:
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    stats = json.loads(proc.stdout.splitlines()[0].split(" ", 1)[1])
    return ({"start-up": (stats["model_load_start_ms"] - launched_ms) / 1000,
             "first token": (stats["first_token_ms"] - launched_ms) / 1000,
             "exit": exit_s}, (cwd / "token_ids.json").read_bytes())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved pairs of runs (the rounds)")
    add_target_option(ap, TARGETS)
    args = ap.parse_args()
    targets = with_overrides(TARGETS, args.target)
    b = bundle_mod.load(export_bundle(args.model))
    files = {f.name: str(f.path) for f in b.files}
    common = [*runner_command(), "--model_path", files[b.modes["kv"].pte], "--tokenizer_path",
              files[b.tokenizer], "--prompt", "Once upon a time", "--seq_len", "64",
              "--temperature", "0", "--eval_mode", str(b.modes["kv"].eval_mode),
              "--token_ids_path", "token_ids.json"]
    with tempfile.TemporaryDirectory(prefix="bench-zygote-") as tmp:
        root = Path(tmp)
        sock = root / "z.sock"
        t0 = time.perf_counter()
        server = subprocess.Popen(zygote.zygote_argv(sock, exit_with_pid=os.getpid()),
                                  env=procs.farm_env(), start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while not zygote.wait_ready(sock, timeout=0.5):  # fail fast if the zygote died
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the zygote did not start (exit {server.poll()})")
            print(f"# {args.model}, kv mode, seq_len 64, {args.repeats} runs each, interleaved; "
                  f"zygote ready in {time.perf_counter() - t0:.2f} s (once per device)", flush=True)
            base = procs.farm_env()
            base.pop("PTEFARM_RUNNER_ZYGOTE", None)
            env = {"in-process": base, "zygote": {**base, "PTEFARM_RUNNER_ZYGOTE": str(sock)}}
            times = {(u, p): {m: [] for m in METRICS} for u in UPDATERS for p in PATHS}
            tokens: dict[tuple[str, str], set[bytes]] = {k: set() for k in times}
            for i in range(args.repeats):
                for u in UPDATERS:
                    for p in PATHS:
                        cwd = root / f"{u}-{p}-{i}"
                        cwd.mkdir()
                        t, ids = one_run([*common, "--kv_updater", u], cwd, env[p])
                        for m in METRICS:
                            times[u, p][m].append(t[m])
                        tokens[u, p].add(ids)
        finally:
            procs.stop_child(server, grace=3)
    print(f"{'updater':<13} {'path':<11} {'metric':<12} {'median s':>9} {'min s':>7} {'max s':>7}")
    for u in UPDATERS:
        for p in PATHS:
            for m in METRICS:
                xs = times[u, p][m]
                print(f"{u:<13} {p:<11} {m:<12} {statistics.median(xs):9.3f} {min(xs):7.3f} "
                      f"{max(xs):7.3f}")
    ratios = []
    for u in UPDATERS:
        same = "same tokens" if len(tokens[u, "in-process"] | tokens[u, "zygote"]) == 1 else \
            "TOKENS DIFFER"
        for m in ("first token", "exit"):
            pairs = zip(times[u, "zygote"][m], times[u, "in-process"][m])
            ratios.append(f"{u} {m} x{Spread.of(z / ip for z, ip in pairs).format('.3f')}")
        ratios[-1] += f" ({same})"
    worst = max(statistics.median(times[u, "zygote"]["first token"]) for u in UPDATERS)
    verdicts = judge([(targets["first_token"], worst)])
    code = print_verdicts(verdicts)
    print(f"summary: zygote/in-process, median (min-max) of {args.repeats} pair(s): {', '.join(ratios)}; "
          f"zygote first token median {worst:.3f} s; {targets_met(verdicts)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
