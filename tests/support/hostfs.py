"""Host filesystems as the farm may meet them: ``coarse_timestamps`` makes the files under one directory
look as they do on a filesystem whose times tick once a second (ext3, HFS+, many network filesystems):
``os.stat`` reports their mtime and ctime rounded down to the second, so a file rewritten within the
second of its last write keeps its size, times and inode. This is the "racily clean" case the farm's
``RACY_NS`` guards against (git's index has the same problem); on this machine's ext4 every write moves
the nanosecond ctime, so without the simulation the case never arises.

``start_of_a_second`` waits for the next second to begin, so that a scenario of a few tens of
milliseconds fits into one tick; ``same_tick`` tells afterwards whether it did.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

NS = 1_000_000_000


class _CoarseStat:
    """An ``os.stat_result`` with its mtime and ctime rounded down to the second."""

    def __init__(self, st: os.stat_result):
        self._st = st

    def __getattr__(self, name: str):
        value = getattr(self._st, name)
        if name in ("st_mtime_ns", "st_ctime_ns"):
            return value // NS * NS
        if name in ("st_mtime", "st_ctime"):
            return float(int(value))
        return value

    def __repr__(self) -> str:
        return f"coarse({self._st!r})"


def coarse_timestamps(monkeypatch, root: Path) -> None:
    """From now until the test ends, files under ``root`` have 1-second timestamps (see above)."""
    real_stat = os.stat
    prefix = str(Path(root).resolve()) + os.sep

    def stat(path, *args, **kwargs):
        st = real_stat(path, *args, **kwargs)
        if isinstance(path, (str, os.PathLike)) and not kwargs.get("dir_fd"):
            name = os.path.abspath(os.fsdecode(os.fspath(path)))
            if name.startswith(prefix):
                return _CoarseStat(st)
        return st

    monkeypatch.setattr(os, "stat", stat)


def start_of_a_second(margin: float = 0.02) -> None:
    """Sleep until just after the next whole second of the wall clock."""
    now = time.time()
    time.sleep(int(now) + 1 + margin - now)


def same_tick(*stamps_ns: int) -> bool:
    """Whether these wall-clock times (ns) fall into one 1-second tick."""
    return len({s // NS for s in stamps_ns}) == 1
