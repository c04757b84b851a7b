"""`farm-llama-runner`'s entry point: the run in a fork of the device's runner zygote when there is one,
else in this process (farm.runner.cli has the flags and the run itself).

With PTEFARM_RUNNER_ZYGOTE naming a zygote's socket, the run happens in a fork of that zygote, which
imported torch once (farm/runner/zygote.py); same flags, outputs and exit codes. This module imports
nothing heavy before that decision: torch comes with farm.runner.engine, in the run.
"""

from __future__ import annotations

import os
import sys

from farm.runner import zygote
from farm.runner import PROG
from farm.runner.cli import exit_code

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
    if socket_path := os.environ.get(zygote.ZYGOTE_ENV):
        code = _via_zygote(socket_path, argv)
    sys.exit(exit_code(argv) if code is None else code)


if __name__ == "__main__":
    main()
