"""``sha256sum`` of a virtual device, run inside it (``/system/bin/sha256sum`` execs
``python -S -m farm.virtual.hashsum ARGS``).

Why not the host's coreutils: a phone's ``sha256sum`` is toybox's, and Android's build of toybox
(``android_defconfig``: ``CONFIG_TOYBOX_LIBCRYPTO=y``) hashes through BoringSSL, which uses the CPU's
SHA-2 instructions. Debian's coreutils 9.1 hashes in portable C, about a quarter of that speed on this
host: a virtual device then spends most of a chunked rebuild's deploy in hashing that no phone does as
slowly. ``hashlib`` is OpenSSL's SHA-256 here, the same kind of code as the phone's.

What toybox's does and the farm relies on: ``sha256sum [-b] [--] [FILE]...``, ``-`` or no FILE for
stdin, a line ``DIGEST  NAME`` per file (``-b``: the digest alone), and for a file that cannot be read
``sha256sum: NAME: REASON`` on stderr, exit 1, the other files still hashed. ``-c`` is not provided.

Standard library only (-S): this is every hash's start-up.
"""

from __future__ import annotations

import hashlib
import os
import sys


def _digest(name: str) -> str:
    if name == "-":
        return hashlib.file_digest(sys.stdin.buffer, "sha256").hexdigest()
    with open(name, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def main(argv: list[str]) -> int:
    brief = False
    names: list[str] = []
    options = True
    for arg in argv:
        if options and arg == "--":
            options = False
        elif options and arg.startswith("-") and arg != "-":
            for flag in arg[1:]:
                if flag != "b":
                    sys.stderr.write(f"sha256sum: Unknown option '{flag}'\n")
                    return 1
            brief = True
        else:
            names.append(arg)
    status = 0
    out = sys.stdout
    for name in names or ["-"]:
        try:
            digest = _digest(name)
        except OSError as e:
            out.flush()
            sys.stderr.write(f"sha256sum: {name}: {os.strerror(e.errno) if e.errno else e}\n")
            status = 1
            continue
        out.write(digest + "\n" if brief else f"{digest}  {name}\n")
    out.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
