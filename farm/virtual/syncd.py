"""The sync worker of a virtual device: one ``sync:`` session on stdin/stdout.

    python -S -m farm.virtual.syncd [--confine ROOT] [--limit-bytes N]

A confined device runs it inside its Android view (farm.virtual.confine), so device paths are resolved
by the kernel in the device's own mount namespace; an unconfined one runs it on the host with
``--confine`` set to its root. ``--limit-bytes``: the largest file a push may write (the device's free
space or its disk_full_after_bytes fault, fixed for the session). Standard library only: it starts in
milliseconds (``-S``: no site-packages needed).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from farm.virtual.sync import IO_BUFFER, SyncService


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m farm.virtual.syncd")
    parser.add_argument("--confine", type=Path, default=None, help="serve only paths inside this")
    parser.add_argument("--limit-bytes", type=int, default=None, help="largest file a push writes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="syncd[%(process)d] %(levelname)s %(message)s")
    try:
        with open(os.dup(0), "rb", buffering=IO_BUFFER) as inp, \
                open(os.dup(1), "wb", buffering=IO_BUFFER) as out:
            SyncService(inp, out, confine_root=args.confine, limit_bytes=args.limit_bytes).serve()
    except BrokenPipeError:  # the device stopped reading: the session is over
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
