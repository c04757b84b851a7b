"""Run a deployed bundle on a device and bring back a typed result.

A run executes the dialect's command line (farm.execute.runprofile) in the bundle workspace, writing into a
per-run directory ``runs/<run id>/``; its files are pulled, parsed and the directory removed.

Errors keep their families apart:
- the runner exited non-zero -> ``RunnerFailed``: the code under test failed (a test failure, not infra);
  its message carries the exit code and the last lines of stderr, ``.result`` the whole of it;
- the runner exited 0 but left no outputs.txt, an empty one, or (for dialects that write token ids) no
  generated tokens -> ``RunIncomplete``: an error of the run, never a pass;
- the runner cannot start at all (its ``--help``, asked first: the linker refuses it or a library,
  the shell cannot run it, it dies of a signal, or it hangs while the device answers) ->
  ``RunnerCannotStart``, a ``UsageError``: the bundle is at fault, never the device;
- the device vanished, adb failed, or the runner hung past the timeout -> ``InfraError``
  (``DeviceGone``, ``AdbError``, ``DeviceTimeout``). On a timeout the runner is killed: closing the
  shell stream makes adbd hang up on it, and the recorded pid is killed as well for adbds that do not;
  then the run's directory is removed (best effort).
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import secrets
import shlex
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from farm.bundle.manifest import Bundle
from farm.config import DEFAULT_HELP_TIMEOUT_S
from farm.device.protocol import DeviceLike
from farm.errors import DeviceTimeout, FarmError, InfraError, RunIncomplete, UsageError
from farm.execute.deploy import bundle_workspace, sync_streams_kept
from farm.execute.runprofile import (
    HELP_PIDFILE,
    RunnerCommand,
    RunRequest,
    build_command,
    help_command,
    help_flags,
    help_names_dialect,
    kill_command,
    runner_path,
    settle_dialect,
)
from farm.vocab import Dialect

log = logging.getLogger(__name__)

OBSERVER_RE = re.compile(r"PyTorchObserver\s+(\{.*\})")
KILL_TIMEOUT_S = 15.0
STDERR_TAIL_LINES = 5


@dataclass
class RunResult:
    serial: str
    bundle: str
    mode: str
    updater: str
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    text: str | None = None  # outputs.txt: the echoed prompt and the generated text (UTF-8, lossy)
    text_bytes: bytes | None = field(default=None, repr=False)  # outputs.txt as the runner wrote it
    tokens_per_s: float | None = None  # inference_speed.txt (includes prefill, as upstream)
    observers: list[dict[str, Any]] = field(default_factory=list)  # one per iteration
    prompt_ids: list[int] | None = None
    generated_ids: list[int] | None = None
    local_dir: Path | None = None
    logits: bytes | None = field(default=None, repr=False)  # --dump_logits_path's file, when asked
    logits_dtype: str | None = None  # its element type: the host runner's float32, a phone's uint16

    @property
    def observer(self) -> dict[str, Any] | None:
        """The last iteration's PyTorchObserver stats."""
        return self.observers[-1] if self.observers else None

    @property
    def decode_tok_s(self) -> float | None:
        """Decode-only rate: tokens after the first over the time from first token to the end."""
        return decode_rate(self.observer)

    @property
    def prefill_tok_s(self) -> float | None:
        return prefill_rate(self.observer)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["text_bytes"]  # JSON has no bytes; ``text`` carries the content
        del d["logits"]  # megabytes of binary: kept in local_dir when one is given
        d["local_dir"] = str(self.local_dir) if self.local_dir else None
        d["decode_tok_s"] = self.decode_tok_s
        d["prefill_tok_s"] = self.prefill_tok_s
        return d


class RunnerFailed(FarmError, AssertionError):
    """The runner ran and exited non-zero: the code under test failed, the farm did not.

    An ``AssertionError`` so that test frameworks count it as a failure, a ``FarmError`` so that the
    CLI prints it as one line. Carries the whole ``RunResult`` (stderr, stdout, exit code).
    """

    def __init__(self, message: str, result: RunResult):
        super().__init__(message)
        self.result = result


def _number(stats: dict[str, Any], key: str) -> float | None:
    value = stats.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def decode_rate(stats: dict[str, Any] | None) -> float | None:
    """Upstream's generation rate (stats.h:134-143, print_report): generated_tokens over
    inference_end - prompt_eval_end. v1.0.1's generated_tokens counts the decode loop alone (the
    token the prefill produced is not in it, token_generator.cpp:326), so no token is taken off."""
    if not stats:
        return None
    generated = _number(stats, "generated_tokens")
    start, end = _number(stats, "prompt_eval_end_ms"), _number(stats, "inference_end_ms")
    if generated is None or start is None or end is None or generated < 1 or end <= start:
        return None
    return generated / ((end - start) / 1000.0)


def prefill_rate(stats: dict[str, Any] | None) -> float | None:
    if not stats:
        return None
    prompt = _number(stats, "prompt_tokens")
    start, end = _number(stats, "inference_start_ms"), _number(stats, "prompt_eval_end_ms")
    if prompt is None or start is None or end is None or end <= start:
        return None
    return prompt / ((end - start) / 1000.0)


def parse_observers(stdout: str) -> list[dict[str, Any]]:
    stats = []
    for match in OBSERVER_RE.finditer(stdout):
        try:
            value = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            stats.append(value)
    return stats


def parse_speed(text: str | None) -> float | None:
    try:
        return float(text.strip()) if text and text.strip() else None
    except ValueError:
        return None


def parse_token_ids(text: str | None) -> tuple[list[int] | None, list[int] | None]:
    if not text:
        return None, None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        return None, None

    def ids(key: str) -> list[int] | None:
        value = raw.get(key) if isinstance(raw, dict) else None
        if isinstance(value, list) and all(isinstance(i, int) for i in value):
            return value
        return None

    return ids("prompt_ids"), ids("generated_ids")


def stderr_tail(result: RunResult, lines: int = STDERR_TAIL_LINES, width: int = 300) -> str:
    """The last ``lines`` non-blank lines of stderr (stdout when stderr is empty), on one line."""
    text = result.stderr.strip() or result.stdout.strip()
    tail = [line.strip()[:width] for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(tail) if tail else "no output"


def check_complete(result: RunResult, command: RunnerCommand) -> None:
    """A runner that exited 0 must have left outputs.txt with content and, when the dialect writes
    token ids, at least one generated token; otherwise ``RunIncomplete``."""
    missing = ""
    if result.text_bytes is None:
        missing = f"no {command.outputs['outputs']}"
    elif not result.text_bytes:
        missing = f"an empty {command.outputs['outputs']}"
    elif "token_ids" in command.outputs:
        name = command.outputs["token_ids"]
        if result.generated_ids is None:
            missing = f"no readable {name}"
        elif not result.generated_ids:
            missing = f"no generated tokens in {name}"
    if missing:
        tail = stderr_tail(result)
        raise RunIncomplete(
            f"runner on {result.serial} exited {result.exit_code} but left {missing} in "
            f"{command.out_dir} ({result.mode}/{result.updater}); stderr: {tail}",
            serial=result.serial, exit_code=result.exit_code, missing=missing, stderr_tail=tail,
            result=result)


def logits_dtype(dialect: Dialect) -> str:
    """The element type of a dump by this dialect's runner (farm/runner/logits.py: the host runner
    writes its model's float32 logits, qnn_llama_runner the QNN model's quantized uint16, both
    little-endian: the same dtypes as logits.dtype_for, named here without importing numpy)."""
    return "<f4" if dialect == Dialect.HOST else "<u2"


def takes_flag(device: DeviceLike, bundle: Bundle, flag: str) -> bool:
    """Whether the bundle's runner on ``device`` takes ``--flag``: a host-dialect runner (the host
    runner, or a wrapper around it) every flag of farm/runner/cli.py, any other what its ``--help``
    lists (asked once by ``runner_dialect``)."""
    if runner_dialect(device, bundle) == Dialect.HOST:
        from farm.runner.cli import FLAGS  # noqa: PLC0415 (light: the host runner's flag table)
        return any(f.name == flag for f in FLAGS)
    with _HELP_LOCK:
        text = _HELP.get(_help_key(device, bundle))
    return text is not None and flag in help_flags(text)


def _help_key(device: DeviceLike, bundle: Bundle) -> tuple[str, str]:
    """Where the answer of the bundle's runner's ``--help`` on ``device`` is kept in ``_HELP``."""
    runner = next((f for f in bundle.files if f.role == "runner" and f.name == bundle.runner), None)
    return device.serial, runner.sha256 if runner else "host-runner"


def new_out_name() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(4)


def _pull_outputs(device: DeviceLike, command: RunnerCommand, timeout: float) -> dict[str, bytes]:
    listing = device.shell(f"ls -1 {shlex.quote(command.out_dir)} 2>/dev/null; true", timeout=timeout)
    present = set(listing.out.splitlines())
    files: dict[str, bytes] = {}
    # One sync session for all of them, as `adb pull` of a directory: a session is a round trip to
    # the server and, on a virtual device, a worker process (three to five of them on every run).
    with sync_streams_kept(device):
        for kind, name in command.outputs.items():
            if name in present:
                files[kind] = device.read_file(posixpath.join(command.out_dir, name), timeout=timeout)
    return files


# (device serial, sha256 of the runner file) -> what its --help printed there. Keyed by the runner's
# bytes, not the whole bundle's: a new .pte beside the same runner needs no new question. Only answers
# are kept: a help that names no dialect (no runner there yet, a stand-in script) is asked again.
_HELP: dict[tuple[str, str], str] = {}
# (device serial, the bundle's files) -> why its runner cannot start there: the next test of the same
# bundle is told at once instead of waiting for a hang again. Keyed by every file (a library the
# runner links may be what is broken), so a bundle fixed and deployed again is asked afresh.
_CANNOT_START: dict[tuple[str, frozenset[tuple[str, str]]], tuple[str, str | None, str]] = {}
_HELP_LOCK = threading.Lock()
# gflags prints --help before the runner loads anything: a runner silent this long hangs at start.
# Generous: farm-llama-runner behind a wrapper takes seconds on a loaded host, and a slow help taken
# for a hang would call a good bundle bad. A farm's [run] help_timeout_s sets it for a run.
HELP_TIMEOUT_S = DEFAULT_HELP_TIMEOUT_S
ALIVE_TIMEOUT_S = 15.0  # the device must answer ``true`` in this long for a hang to be the runner's
_LINKER = re.compile(r'CANNOT LINK EXECUTABLE "[^"]*": (.*)')
# A library the runner loads while it runs (QNN's dlopen of libQnnHtp.so on a phone; on a virtual device
# the host runner's executorch, which links libqnn_executorch_backend.so and finds the bundle's first):
# bionic's ``dlopen failed: library "X" not found`` or ``"X" has bad ELF magic``, glibc's ``X: file too
# short``, ``invalid ELF header``, ``wrong ELF class``, ``cannot open shared object file``.
_LOADER = re.compile(r'dlopen failed: (?:library )?"([^"]+)"|'
                     r'([^\s:"]+\.so(?:\.[\d.]+)?): (?:file too short|invalid ELF header|'
                     r'wrong ELF class|cannot open shared object file)')


class RunnerCannotStart(UsageError):
    """The bundle's runner cannot start on a device: the linker refuses it or a library it needs,
    the shell cannot run it, it dies of a signal or hangs before printing its ``--help``. Bad input
    (the bundle's fault, exit 2): never an infrastructure error that would quarantine the device."""

    def __init__(self, message: str, *, serial: str, runner: str, culprit: str, said: str):
        super().__init__(message)
        self.serial, self.runner, self.culprit, self.said = serial, runner, culprit, said


def start_failure(text: str, exit_code: int | None) -> tuple[str, str | None] | None:
    """Why a runner whose ``--help`` printed ``text`` and exited ``exit_code`` cannot start at all:
    (reason, the file the device names, if any); None when it started (any help, even one naming no
    dialect, or the shell's complaint that the workspace is not there yet).

    Bionic's linker says ``CANNOT LINK EXECUTABLE "<exe>": <error>`` with the culprit quoted first in
    the error (``library "libqnn_executorch_backend.so" not found``, ``"<path>" has bad ELF magic``);
    sh exits 126 (cannot execute) or 127 (not found); 128+N is a death by signal N."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    linked = next((m for m in map(_LINKER.search, lines) if m), None)
    if linked is not None:
        quoted = re.search(r'"([^"]+)"', linked.group(1))
        return "the dynamic linker refuses it", quoted.group(1) if quoted else None
    library = library_failure(text)
    if library is not None and exit_code != 0:
        return "a library it loads is refused", library
    if exit_code in (126, 127):
        return f"the shell cannot run it (exit {exit_code})", None
    if exit_code is not None and exit_code > 128:
        try:  # 129..159: a signal's death; 255 and the like are the runner's own exit codes
            name = signal.Signals(exit_code - 128).name
        except ValueError:
            return None
        return f"it was killed by {name} at start (exit {exit_code})", None
    return None


def library_failure(text: str) -> str | None:
    """The library a runner's output says could not be loaded (missing, not ELF, another machine's),
    or None."""
    found = _LOADER.search(text)
    return (found.group(1) or found.group(2)) if found else None


def _bundle_key(bundle: Bundle) -> frozenset[tuple[str, str]]:
    return frozenset((f.name, f.sha256) for f in bundle.files)


def _cannot_start(device: DeviceLike, bundle: Bundle, reason: str, culprit: str | None,
                  said: str) -> RunnerCannotStart:
    with _HELP_LOCK:
        _CANNOT_START[(device.serial, _bundle_key(bundle))] = (reason, culprit, said)
    runner = runner_path(bundle)
    named = posixpath.basename(culprit) if culprit else None
    where = ""
    if named:
        mine = next((f for f in bundle.files if f.name == named), None)
        where = (f"; the file it names, {named}, is the bundle's {mine.path}" if mine else
                 f"; the file it names, {named}, is not in the bundle")
    message = (f"{bundle.manifest_path or bundle.name}: runner {runner} on {device.serial} cannot "
               f"start: {reason}{where}; the device said: {said or '(nothing)'}; the bundle is at "
               f"fault, not the device: fix its runner or libraries and create it again")
    return RunnerCannotStart(message, serial=device.serial, runner=runner, culprit=named or runner,
                             said=said)


def _ask_help(device: DeviceLike, bundle: Bundle, workspace: str, timeout: float):
    """The runner's ``--help`` on the device. A help that does not finish on a device that still
    answers is the runner's hang at start (killed, then ``RunnerCannotStart``); a device that does
    not answer either is the device's (the ``DeviceTimeout`` stands)."""
    try:
        return device.shell(help_command(bundle, workspace), timeout=timeout)
    except DeviceTimeout as timed_out:
        try:
            device.shell("true", timeout=ALIVE_TIMEOUT_S)
        except InfraError:
            raise timed_out from None
        pidfile = shlex.quote(posixpath.join(workspace, HELP_PIDFILE))
        marker = shlex.quote(posixpath.basename(runner_path(bundle)))
        try:  # the pid is trusted only while its cmdline still names the runner
            device.shell(f"pid=$(cat {pidfile} 2>/dev/null) && [ -n \"$pid\" ] && grep -qF -- "
                         f"{marker} /proc/$pid/cmdline 2>/dev/null && kill -9 $pid; rm -f {pidfile}; "
                         f"true", timeout=KILL_TIMEOUT_S)
        except InfraError as e:
            log.warning("device %s: killing a hung --help failed: %s", device.serial, e)
        raise _cannot_start(device, bundle, f"its --help did not finish in {timeout:g} s while the "
                            f"device answered (it hangs at start)", None, str(timed_out)) from None


def runner_dialect(device: DeviceLike, bundle: Bundle, *, timeout: float = HELP_TIMEOUT_S) -> Dialect:
    """The dialect to drive the bundle's runner with on ``device`` (deployed already). A bundle of
    declared dialect ``host`` is the farm's own runner: taken as declared. Any other runner prints its
    ``--help`` once per device and runner build (cached for the process); ``auto`` takes the dialect
    it shows, a declaration it contradicts is a ``UsageError`` (farm.execute.runprofile.settle_dialect).
    A runner that cannot start at all is ``RunnerCannotStart`` (see ``start_failure``), after
    ``timeout`` when it hangs."""
    if bundle.runner_dialect == Dialect.HOST:
        return Dialect.HOST
    key = _help_key(device, bundle)
    with _HELP_LOCK:
        text = _HELP.get(key)
        known_failure = _CANNOT_START.get((device.serial, _bundle_key(bundle)))
    if text is not None:
        return settle_dialect(bundle, text, device.serial)
    if known_failure is not None:
        raise _cannot_start(device, bundle, *known_failure)
    # gflags exits 1 after --help: the text, not the exit code, is the answer.
    shell = _ask_help(device, bundle, bundle_workspace(device, bundle), timeout)
    text = shell.out + shell.err  # the runner's own output is on stdout; the shell's complaints not
    if not help_names_dialect(text):
        failure = start_failure(text, shell.exit_code)
        if failure is not None:
            said = " | ".join(line.strip()[:300] for line in text.splitlines() if line.strip())[-1200:]
            raise _cannot_start(device, bundle, *failure, said)
    dialect = settle_dialect(bundle, text, device.serial, exit_code=shell.exit_code)
    if help_names_dialect(text):
        with _HELP_LOCK:
            _HELP[key] = text
    return dialect


def run(device: DeviceLike, bundle: Bundle, request: RunRequest, *, timeout: float = 600.0,
        local_dir: Path | None = None, keep_remote: bool = False, out_name: str | None = None,
        io_timeout: float = 60.0) -> RunResult:
    """Run ``request`` with the bundle already deployed (farm.execute.deploy) on ``device``.

    ``timeout`` bounds the runner; ``io_timeout`` every other device call. With ``local_dir`` the
    pulled output files are also written there. Raises ``RunnerFailed`` for a non-zero exit,
    ``RunIncomplete`` for a zero exit without outputs.
    """
    workspace = bundle_workspace(device, bundle)
    dialect = runner_dialect(device, bundle, timeout=io_timeout)
    command = build_command(bundle, request, workspace, out_name or new_out_name(), dialect)
    started = time.monotonic()
    try:
        shell = device.shell(command.shell, timeout=timeout)
    except DeviceTimeout:
        cleanup = kill_command(command)
        if not keep_remote:
            cleanup = f"{{ {cleanup}; }}; rm -rf {shlex.quote(command.out_dir)}"
        try:
            device.shell(cleanup, timeout=KILL_TIMEOUT_S)
        except InfraError as e:  # the device may be unusable now; the timeout is what we report
            log.warning("device %s: cleaning up after a timed-out run failed: %s", device.serial, e)
        raise
    duration = time.monotonic() - started

    files = _pull_outputs(device, command, io_timeout)
    if not keep_remote:
        device.shell(f"rm -rf {shlex.quote(command.out_dir)}", timeout=io_timeout)
    if local_dir is not None:
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        for kind, data in files.items():
            (local_dir / command.outputs[kind]).write_bytes(data)
        (local_dir / "stdout.txt").write_bytes(shell.stdout)
        (local_dir / "stderr.txt").write_bytes(shell.stderr)

    def text(kind: str) -> str | None:
        return files[kind].decode("utf-8", errors="replace") if kind in files else None

    prompt_ids, generated_ids = parse_token_ids(text("token_ids"))
    result = RunResult(
        serial=device.serial, bundle=bundle.name, mode=request.mode, updater=request.updater,
        command=command.shell, exit_code=shell.exit_code, stdout=shell.out, stderr=shell.err,
        duration_s=duration, text=text("outputs"), text_bytes=files.get("outputs"),
        tokens_per_s=parse_speed(text("speed")),
        observers=parse_observers(shell.out), prompt_ids=prompt_ids, generated_ids=generated_ids,
        local_dir=local_dir, logits=files.get("logits"),
        logits_dtype=logits_dtype(dialect) if "logits" in command.outputs else None)
    if shell.exit_code != 0:
        library = library_failure(shell.out + shell.err)
        if library is not None:  # the bundle's libraries, not the model: bad input, as at --help
            raise _cannot_start(device, bundle, f"it exited {shell.exit_code}: a library it loads "
                                f"is refused", library, stderr_tail(result))
        raise RunnerFailed(f"runner on {device.serial} exited {shell.exit_code}: "
                           f"{stderr_tail(result)}", result)
    check_complete(result, command)
    return result
