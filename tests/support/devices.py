"""Helpers of the device-layer tests: hand-made bundles, a fake runner that reports its argv, and a
counter of the sync streams a device opens."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from farm.bundle.manifest import Bundle, Mode, describe_file
from farm.selftest.bundles import write
from tests.support.runner_help_texts import BY_DIALECT

# A stand-in for qnn_llama_runner. It writes, as outputs.txt, a JSON report of exactly what it
# received (argv, the library paths, cwd), so tests compare prompts byte for byte. Magic first
# prompts: HANG sleeps (for timeouts), FAIL exits 7 with a message on stderr. ``--help`` prints HELP and
# exits 1, as gflags does (the help of the release its dialect stands for: tests/support/runner_help_texts.py).
FAKE_RUNNER = r'''#!/usr/bin/env python3
import json, os, sys, time
HELP = @HELP@
args = sys.argv[1:]
if args == ["--help"]:
    sys.stdout.write(HELP)
    sys.exit(1)
opts, prompts, i = {}, [], 0
while i < len(args):
    if args[i] == "--shared_buffer":
        opts[args[i]] = True
        i += 1
        continue
    if args[i] == "--prompt":
        prompts.append(args[i + 1])
    else:
        opts[args[i]] = args[i + 1]
    i += 2
if prompts and prompts[0] == "HANG":
    print("hanging", flush=True)
    time.sleep(600)
if prompts and prompts[0] == "FAIL":
    print("fake runner: cannot load model", file=sys.stderr)
    sys.exit(7)
if prompts and prompts[0] == "NOLIB":  # QNN's dlopen of its backend, while running, is refused
    print("[ERROR] [Qnn ExecuTorch]: dlopen failed: library \"libQnnHtp.so\" not found",
          file=sys.stderr)
    sys.exit(1)
report = {"argv": sys.argv[1:], "prompts": prompts, "cwd": os.getcwd(),
          "env": {k: os.environ.get(k) for k in ("LD_LIBRARY_PATH", "ADSP_LIBRARY_PATH")},
          "model": open(opts["--model_path"], "rb").read().decode()}
with open(opts["--output_path"], "w") as f:
    json.dump(report, f)
if "--token_ids_path" in opts:  # a runner speaking the host runner's dialect writes its ids too
    with open(opts["--token_ids_path"], "w") as f:
        json.dump({"prompt_ids": [1, 2], "generated_ids": [3, 4]}, f)
if "--dump_logits_path" in opts:  # two steps of four uint16 logits, as qnn_llama_runner writes them
    with open(opts["--dump_logits_path"], "wb") as f:
        f.write(bytes(range(16)))
with open(opts["--performance_output_path"], "w") as f:  # a fixed, updater-dependent speed
    f.write("50.0\n" if opts.get("--kv_updater") == "ShiftPointer" else "42.5\n")
print("PyTorchObserver " + json.dumps({"prompt_tokens": 10, "generated_tokens": 11,
      "inference_start_ms": 1000, "prompt_eval_end_ms": 1100, "first_token_ms": 1100,
      "inference_end_ms": 1600}))
'''


def make_qnn_bundle(root: Path, name: str = "fake-qnn", *, dialect: str = "qnn-v1.0",
                    archs: tuple[str, ...] = ("v73", "v75"), pte_bytes: int = 4096,
                    runner_help: str | None = None) -> Path:
    """A manifest in the shape of a real QNN bundle: .pte files, the runner, the backend library,
    per-arch QNN libraries (their content names their arch) and a tokenizer. Returns its path.
    The runner's --help is ``runner_help``, by default that of the release ``dialect`` stands for."""
    help_text = BY_DIALECT.get(dialect, "") if runner_help is None else runner_help
    root.mkdir(parents=True, exist_ok=True)
    files = [
        describe_file(root, write(root / "kv.pte", "kv-model " + "k" * pte_bytes), role="pte"),
        describe_file(root, write(root / "hybrid.pte", "hybrid-model " + "h" * pte_bytes), role="pte"),
        describe_file(root, write(root / "tokenizer.model", "tok"), role="tokenizer"),
        describe_file(root, write(root / "qnn_llama_runner",
                                  FAKE_RUNNER.replace("@HELP@", repr(help_text)), 0o644), role="runner"),
        describe_file(root, write(root / "libqnn_executorch_backend.so", "backend"),
                      role="backend_lib"),
    ]
    for arch in archs:
        n = arch[1:]
        files.append(describe_file(root, write(root / arch / f"libQnnHtpV{n}Stub.so", f"stub {arch}"),
                                   role="qnn_lib", name=f"libQnnHtpV{n}Stub.so", htp_arch=arch))
        files.append(describe_file(root, write(root / arch / "libQnnHtp.so", f"htp {arch}"),
                                   role="qnn_lib", name="libQnnHtp.so", htp_arch=arch))
    bundle = Bundle(name=name, runner_dialect=dialect, tokenizer="tokenizer.model", files=files,
                    modes={"kv": Mode("kv.pte", 0, 1), "hybrid": Mode("hybrid.pte", 1, 32)},
                    runner="qnn_llama_runner")
    manifest = root / "manifest.json"
    bundle.write(manifest)
    return manifest


def bundles_per_dialect(root: Path, prefix: str) -> dict[str, Path]:
    """One fake bundle per QNN runner dialect: {dialect: manifest}."""
    return {d: make_qnn_bundle(root / d, name=f"{prefix}-{d}", dialect=d)
            for d in ("qnn-v1.0", "qnn-v1.4")}


@contextlib.contextmanager
def alongside(fn):
    """Run ``fn`` in a thread while the block runs (a fault injected mid-operation); joined after,
    whatever the block did."""
    thread = threading.Thread(target=fn)
    thread.start()
    try:
        yield thread
    finally:
        thread.join()


def counting_sync_opens(device, monkeypatch) -> list[str]:
    """The ``sync:`` streams ``device`` (a farm.devices.Device) opens from now on, one entry each."""
    opened: list[str] = []
    real_open = type(device)._open

    def counting_open(self, service, timeout):
        if service == "sync:":
            opened.append(service)
        return real_open(self, service, timeout)

    monkeypatch.setattr(type(device), "_open", counting_open)
    return opened


def wait_for_sync_sessions_to_end(vf, serial: str, timeout: float = 20.0) -> None:
    """Wait until a virtual device serves no sync session: only the one worker it keeps started ahead
    of need is left (farm.virtual.syncpump.WarmWorkers). A session's worker removes the temporary file
    of a push cut off mid-way when its input ends, as adbd does, but on a loaded machine it may not
    even have created that file yet when the client has gone: looking for the file alone races."""
    import psutil

    device = psutil.Process(vf.device(serial).pid)
    deadline = time.monotonic() + timeout
    while True:
        workers = []
        for proc in device.children(recursive=True):
            try:
                if proc.cmdline()[1:4] == ["-S", "-m", "farm.virtual.syncd"]:  # not nsenter's
                    workers.append(proc)
            except psutil.Error:
                continue  # gone meanwhile
        if len(workers) <= 1:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"device {serial}: {len(workers)} sync workers still running "
                                 f"after {timeout:g} s")
        time.sleep(0.05)
