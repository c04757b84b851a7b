"""Bundles of random files, for deploy tests that need bytes no bug can produce by accident."""

from __future__ import annotations

import os
from pathlib import Path

from farm.bundle.manifest import Bundle, Mode, describe_file


def make_bundle(root: Path, name: str, sizes: dict[str, int]) -> Bundle:
    """A bundle of random files (content that no bug can produce by accident)."""
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for file_name, size in sizes.items():
        path = root / file_name  # a name may have directories: "lib/x.so"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
        files.append(describe_file(root, path, role="pte" if file_name.endswith(".pte") else "other",
                                   name=file_name))
    first = next(iter(sizes))
    return Bundle(name=name, runner_dialect="host", tokenizer=first, files=files,
                  modes={"kv": Mode(first, 0, 1)})
