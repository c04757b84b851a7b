"""`farm-llama-runner`: a host stand-in for qnn_llama_runner v1.0.1 with the same flags and output files.

    farm-llama-runner --model_path kv_llama_xnnpack.pte --tokenizer_path tokenizer.model \\
        --prompt "Once upon a time" --seq_len 64 --eval_mode 0 --kv_updater SmartMask

Writes --output_path (echoed prompt + generated text, all iterations), --performance_output_path (one
float: tokens/second of the last iteration, prefill included, as upstream) and prints one
`PyTorchObserver {json}` line per iteration on stdout. Flags of ours: --token_ids_path (JSON with the
prompt and generated token ids of the last iteration, so comparisons can be exact) and --seed.
gflags spellings are accepted: `--flag value`, `--flag=value`, `-flag value`.
Bad input: one line `farm-llama-runner: error: ...` on stderr and exit code 2.

With PTEFARM_RUNNER_ZYGOTE naming a zygote's socket, the run happens in a fork of that zygote, which
imported torch once (farm/runner/zygote.py); same flags, outputs and exit codes. This module imports
nothing heavy before that decision: torch comes with farm.runner.engine, in run().
"""

from __future__ import annotations

import os
import sys

from farm.runner import zygote
from farm.runner.cli import PROG, exit_code

ZYGOTE_ENV = "PTEFARM_RUNNER_ZYGOTE"  # a zygote's socket (farm/runner/zygote.py): run there, fast
# Set by a device that wants a zygote but starts none itself: the first run that finds no zygote
# starts one in the background and runs through it once it is ready; the runs after it fork from it. A
# device whose commands never run this runner never pays the zygote's imports.
SPAWN_ENV = "PTEFARM_RUNNER_ZYGOTE_SPAWN"
SPAWN_WAIT_S = 120.0


def _via_zygote(socket_path: str, argv: list[str]) -> int | None:
    """The run's exit code from the zygote at ``socket_path``; None (said on stderr) when it did not
    take the run. Imports only the standard library: this is the whole start-up of a zygote run."""
    try:
        return zygote.run_remote(socket_path, argv)
    except zygote.NotAnswering as e:
        if os.environ.get(SPAWN_ENV) != "1":
            print(f"{PROG}: runner zygote {socket_path} not answering ({e}): running in-process",
                  file=sys.stderr)
            return None
    # The device's first run: start its zygote (or let the run that already does) and wait for it
    # rather than import torch here too, which would double the first run's CPU on a busy host.
    zygote.start_detached(socket_path)
    if zygote.wait_ready(socket_path, SPAWN_WAIT_S):
        try:
            return zygote.run_remote(socket_path, argv)
        except zygote.NotAnswering as e:
            print(f"{PROG}: runner zygote {socket_path} not answering ({e}): running in-process",
                  file=sys.stderr)
            return None
    print(f"{PROG}: runner zygote {socket_path} did not start in {SPAWN_WAIT_S:g} s: running in-process",
          file=sys.stderr)
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    code = None
    if socket_path := os.environ.get(ZYGOTE_ENV):
        code = _via_zygote(socket_path, argv)
    sys.exit(exit_code(argv) if code is None else code)


if __name__ == "__main__":
    main()
