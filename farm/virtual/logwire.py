"""What both ends of a virtual device's logd share: its buffers, priorities and crash signals, where
its socket and tombstones are, and the client's connection (farm/virtual/logd.py is the daemon).

Its own module, importing only ``os``, ``socket`` and ``contextlib``: the clients (``log``, ``logcat``
and the runner's wrapper) start once per runner run, inside the device, and the daemon's imports
(logging, threading, dataclasses, pathlib) were two thirds of the wrapper's start-up.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

BUFFERS = ("main", "system", "crash")
DEFAULT_BUFFERS = ("main", "system", "crash")  # what `logcat` reads without -b, as on Android 7+
SOCKET_NAME = "logd"
SOCKET_REL = "run/socket"                       # -> /dev/socket inside the view (read-only)
TOMBSTONES_REL = "tombstones"                   # -> /data/tombstones inside the view (read-only)
PRIORITIES = "??VDIWEFS"                        # index = Android's log priority (2 V ... 7 F, 8 S)

# The signals debuggerd reports (bionic's debuggerd_handler); a SIGKILL or SIGTERM leaves no tombstone.
CRASH_SIGNALS = {4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV",
                 16: "SIGSTKFLT", 31: "SIGSYS"}


def short_path(directory: str | os.PathLike, name: str) -> tuple[int, str]:
    """(an fd of ``directory``, a path to ``name`` in it under 107 bytes). Close the fd after use."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    return fd, f"/proc/self/fd/{fd}/{name}"


@contextmanager
def connect(socket_path: str, timeout: float = 10.0) -> Iterator[socket.socket]:
    """A connection to a device's logd (used by the tools inside it and by tests)."""
    directory, name = os.path.split(socket_path)
    fd, short = short_path(directory or ".", name)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(short)
        yield sock
    finally:
        sock.close()
        os.close(fd)
