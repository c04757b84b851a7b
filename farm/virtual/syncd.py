"""The sync worker of a virtual device: one ``sync:`` session on stdin/stdout.

    python -S -m farm.virtual.syncd [--confine ROOT]

A confined device runs it inside its Android view (farm.virtual.confine), so device paths are resolved
by the kernel in the device's own mount namespace; an unconfined one runs it on the host with
``--confine`` set to its root. The device keeps one worker started ahead of need (it waits on stdin),
so what a session must decide comes first on stdin, one line: ``limit=N`` (the largest file a push may
write: the device's free space or its disk_full_after_bytes fault, fixed for the session) or
``limit=-``. Standard library only, ``-S``: no site-packages needed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from farm.virtual.sync import IO_BUFFER, SyncService

HEADER_PREFIX = b"limit="


def header(limit_bytes: int | None) -> bytes:
    """The session's first line on the worker's stdin."""
    return HEADER_PREFIX + (b"-" if limit_bytes is None else str(int(limit_bytes)).encode()) + b"\n"


def _parse_args(argv: list[str]) -> Path | None:
    # By hand, not argparse: one optional flag, and its import is a third of this worker's start-up.
    if not argv:
        return None
    if len(argv) == 2 and argv[0] == "--confine":
        return Path(argv[1])
    print(f"usage: python -m farm.virtual.syncd [--confine ROOT] (got {argv!r})", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    confine = _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        with open(os.dup(0), "rb", buffering=IO_BUFFER) as inp, \
                open(os.dup(1), "wb", buffering=IO_BUFFER) as out:
            line = inp.readline()
            if not line:  # a warm worker the device never used (it stopped)
                return 0
            value = line.rstrip(b"\n").removeprefix(HEADER_PREFIX)
            if not line.startswith(HEADER_PREFIX) or not (value == b"-" or value.isdigit()):
                print(f"syncd: bad session header {line[:80]!r}", file=sys.stderr)
                return 2
            limit = None if value == b"-" else int(value)
            SyncService(inp, out, confine_root=confine, limit_bytes=limit).serve()
    except BrokenPipeError:  # the device stopped reading: the session is over
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
