"""Stand-in bundles, written by hand: files with a chosen content and mode, and a runner (qnn-v1.0
dialect) that misbehaves on purpose, for `farm chaos` and the project's tests."""

from __future__ import annotations

import os
from pathlib import Path

from farm.bundle.manifest import Bundle, Mode, describe_file


def write(path: Path, data: bytes | str, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(path, mode)
    return path


# -- a stand-in runner (qnn-v1.0 dialect) with a chosen misbehaviour --------------------------------

STAND_IN_RUNNER = r'''#!/usr/bin/env python3
import json, sys
BEHAVIOUR = {behaviour!r}
args = sys.argv[1:]
if args == ["--help"]:  # it starts like v1.0.1's runner: whatever it does wrong, it does in a run
    print("    -kv_updater (How to update kv cache. Choose between SmartMask and ShiftPointer) "
          "type: string default: \"SmartMask\"")
    sys.exit(1)
opts = {{args[i]: args[i + 1] for i in range(0, len(args) - 1, 2) if args[i].startswith("--")}}
if opts.get("--prompt") == "HANG":
    import time
    time.sleep(600)
if BEHAVIOUR == "crash":
    print("qnn_llama_runner: loading model", flush=True)
    sys.stderr.write("QnnDsp <E> Failed to create context from binary\nSegmentation fault\n")
    sys.exit(139)
if BEHAVIOUR == "no-output":
    sys.exit(0)
with open(opts["--output_path"], "wb") as f:
    f.write(b"\xff\xfe\x00garbage\x93" * 7 if BEHAVIOUR == "garbage" else
            ("<|begin_of_text|>" + opts["--prompt"] + " and so on").encode())
with open(opts["--performance_output_path"], "w") as f:
    f.write("42.0\n")
'''


def stand_in_bundle(root: Path, behaviour: str) -> Path:
    """A bundle in ``root`` whose runner is STAND_IN_RUNNER with ``behaviour`` (echo, crash, no-output,
    garbage); returns its manifest."""
    root.mkdir(parents=True, exist_ok=True)
    files = [describe_file(root, write(root / "kv.pte", "kv model", 0o644), role="pte"),
             describe_file(root, write(root / "tokenizer.model", "tok", 0o644), role="tokenizer"),
             describe_file(root, write(root / "qnn_llama_runner",
                                       STAND_IN_RUNNER.format(behaviour=behaviour), 0o755), role="runner")]
    bundle = Bundle(name=f"stand-in-{behaviour}", runner_dialect="qnn-v1.0",
                    tokenizer="tokenizer.model", files=files, modes={"kv": Mode("kv.pte", 0, 1)},
                    runner="qnn_llama_runner")
    bundle.write(root / "manifest.json")
    return root / "manifest.json"
