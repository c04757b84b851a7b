"""The shell commands a deploy sends, within the size one adb shell request can carry, and the parsers
of what ``stat`` and ``sha256sum`` print back (farm.execute.deploy and farm.execute.chunkstore)."""

from __future__ import annotations

import logging
import re
import shlex
from dataclasses import dataclass

from farm.device.protocol import DeviceLike
from farm.errors import InfraError

log = logging.getLogger(__name__)

# Every shell command a deploy sends is at most this many bytes: a bundle of thousands of files is
# stat'ed, hashed, renamed and cleaned up in several commands, never one. A command travels as one adb
# service request, "shell,v2,raw:" + command: the adb server reads its length as four hex digits (at
# most 65535 bytes), adbd receives it in one packet (its max payload: 256 KiB or 1 MiB on Android 7 and
# later) and runs it as the single argument of ``sh -c``, which Linux caps at 128 KiB (MAX_ARG_STRLEN).
# A quarter of the tightest of these leaves room for the service prefix and for any adb in between
# that allows less; a 10,000-file bundle still needs only a few dozen commands.
COMMAND_BYTES = 16 * 1024

# A pushed file's temporary name ends in this until one command renames it in; any name holding it is
# a leftover of an interrupted deploy, which the next deploy removes (the workspace's and the chunk
# store's alike).
PARTIAL_SUFFIX = ".ptefarm-partial"

@dataclass(frozen=True)
class Remote:
    size: int
    mtime: int


def discard(device: DeviceLike, remotes: list[str], timeout: float) -> None:
    """Remove pushed temp files, best effort (the next deploy removes leftovers anyway)."""
    rm = "rm -f --"
    for group in groups([shlex.quote(r) for r in remotes], len(rm) + 1):
        try:
            device.shell(f"{rm} {group}", timeout=timeout)
        except InfraError as e:
            log.warning("device %s: could not remove %s (the next deploy will): %s", device.serial,
                        group, e)


def groups(words: list[str], overhead: int, sep: str = " ") -> list[str]:
    """``words`` (each already shell-quoted: a name, or a whole command when ``sep`` is " && "), in
    order, joined by ``sep`` into as few strings as fit, each at most ``COMMAND_BYTES - overhead``
    bytes (the rest of the command it goes into). A word longer than that still gets a string of its
    own (a name is at most PATH_MAX, 4 KiB: far below the bound)."""
    room = COMMAND_BYTES - overhead
    groups: list[list[str]] = []
    used = 0
    for word in words:
        size = len(word.encode())
        if not groups or used + len(sep) + size > room:
            groups.append([word])
            used = size
        else:
            groups[-1].append(word)
            used += len(sep) + size
    return [sep.join(group) for group in groups]


def parse_stat(text: str) -> dict[str, Remote]:
    found: dict[str, Remote] = {}
    for line in text.split("\n"):
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[1].lstrip("-").isdigit():
            found[parts[2]] = Remote(int(parts[0]), int(parts[1]))
    return found


_SHA256SUM_ESCAPES = {"n": "\n", "r": "\r"}  # coreutils writes \\, \n, \r for \, newline, CR


def parse_sha256sum(text: str) -> dict[str, str]:
    digests: dict[str, str] = {}
    for line in text.split("\n"):
        escaped = line.startswith("\\")  # coreutils escapes names containing \, newline or CR
        if escaped:
            line = line[1:]
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            continue
        if escaped:  # left to right: an escaped "\\n" is a backslash and an n, not a newline
            name = re.sub(r"\\(.)", lambda m: _SHA256SUM_ESCAPES.get(m[1], m[1]), name, flags=re.S)
        digests[name] = digest.lower()
    return digests
