"""A device and a runner for the fast tests of farm.execute.run (no adb, no virtual device).

``RecordingDevice`` is a FakeDevice that also records the timeout of every shell command and file read,
and can hand the runner's own command (the one that ``exec``s it) to a stand-in: an adb connection that
times out, say. ``SCRIPTED_RUNNER`` takes the farm's flags and does what its first prompt, a JSON
script, says: which output files to leave with which bytes, what to print, how long to sleep, which
code to exit with. ``--help`` prints the help text it was built with and exits 1, as gflags does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from farm.bundle import manifest as bundle_mod
from farm.bundle.manifest import Bundle, describe_file
from farm.device.transport import ShellResult
from farm.execute.runprofile import RunRequest
from tests.support.fake_device import FakeDevice

SCRIPTED_RUNNER = r'''#!/usr/bin/env python3
import json, sys, time
HELP = @HELP@
args = sys.argv[1:]
if args == ["--help"]:
    sys.stdout.write(HELP)
    sys.exit(1)
opts, prompts, i = {}, [], 0
while i < len(args):
    if args[i] == "--shared_buffer":
        opts[args[i]] = True
        i += 1
        continue
    if args[i] == "--prompt":
        prompts.append(args[i + 1])
    else:
        opts[args[i]] = args[i + 1]
    i += 2
script = json.loads(prompts[0])
time.sleep(script.get("sleep", 0))
files = {"outputs_hex": "--output_path", "speed": "--performance_output_path", "ids": "--token_ids_path",
         "logits_hex": "--dump_logits_path"}
for key, flag in files.items():
    if key in script and flag in opts:
        data = bytes.fromhex(script[key]) if key.endswith("_hex") else script[key].encode()
        with open(opts[flag], "wb") as f:
            f.write(data)
sys.stdout.write(script.get("stdout", "") + json.dumps({"argv": sys.argv[1:]}) + "\n")
sys.stderr.write(script.get("stderr", ""))
sys.exit(script.get("code", 0))
'''


def runner_script(help_text: str) -> str:
    return SCRIPTED_RUNNER.replace("@HELP@", repr(help_text))


def scripted(*, text: str | bytes | None = None, speed: str | None = None, ids: Any = None,
             logits: bytes | None = None, stdout: str = "", stderr: str = "", code: int = 0,
             sleep: float = 0, **request: Any) -> RunRequest:
    """A request whose runner leaves ``text`` as outputs.txt (bytes as they are, str as UTF-8; None:
    no file), ``speed`` as the speed file and ``ids`` (JSON-encoded unless a str) as token_ids.json."""
    script: dict[str, Any] = {"stdout": stdout, "stderr": stderr, "code": code, "sleep": sleep}
    if text is not None:
        script["outputs_hex"] = (text.encode() if isinstance(text, str) else text).hex()
    if speed is not None:
        script["speed"] = speed
    if ids is not None:
        script["ids"] = ids if isinstance(ids, str) else json.dumps(ids)
    if logits is not None:  # written where --dump_logits_path says (the request must ask for it)
        script["logits_hex"] = logits.hex()
    return RunRequest(prompts=[json.dumps(script)], **request)


def scripted_bundle(root: Path, name: str, help_text: str, *, dialect: str = "auto") -> Bundle:
    """A QNN-shaped bundle (tests/support/devices.py) whose runner is SCRIPTED_RUNNER printing
    ``help_text`` for --help. Runners of equal ``help_text`` are the same build (the same bytes)."""
    from tests.support.devices import make_qnn_bundle

    bundle = bundle_mod.load(make_qnn_bundle(root, name=name, dialect="qnn-v1.0"))
    runner = root / bundle.runner
    runner.write_text(runner_script(help_text))
    files = [describe_file(root, runner, role="runner") if f.role == "runner" else f for f in bundle.files]
    return dataclasses.replace(bundle, files=files, runner_dialect=dialect)


RunnerStandIn = Callable[[FakeDevice, str, float], ShellResult]


class RecordingDevice(FakeDevice):
    """A FakeDevice recording ``(what, command or path, timeout)`` for every shell and read."""

    def __init__(self, root: Path, **kw: Any):
        super().__init__(root, **kw)
        self.calls: list[tuple[str, str, float | None]] = []
        self.runner_stand_in: RunnerStandIn | None = None
        self.fail: Callable[[str], Exception | None] = lambda command: None

    def shell(self, command: str, *, timeout: float, check: bool = False) -> ShellResult:
        self.calls.append(("shell", command, timeout))
        if (error := self.fail(command)) is not None:
            raise error
        if self.runner_stand_in is not None and is_runner_command(command):
            return self.runner_stand_in(self, command, timeout)
        return super().shell(command, timeout=timeout, check=check)

    def read_file(self, remote: str, *, timeout: float = 60.0) -> bytes:
        self.calls.append(("read", remote, timeout))
        return super().read_file(remote, timeout=timeout)

    def help_calls(self) -> list[str]:
        return [c for what, c, _ in self.calls if what == "shell" and c.endswith("--help 2>&1")]

    def runner_calls(self) -> list[str]:
        return [c for what, c, _ in self.calls if what == "shell" and is_runner_command(c)]


def is_runner_command(command: str) -> bool:
    """The command of a run (farm.execute.runprofile.build_command), not of a --help or a clean-up."""
    return " && exec " in command and " --output_path " in command
