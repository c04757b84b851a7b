"""Runner dialects: how a run request becomes the command line of one runner build.

Three dialects exist (see the ExecuTorch fact sheet):

- ``qnn-v1.0``: ``./qnn_llama_runner`` of releases v0.7 .. v1.0.1, takes ``--kv_updater
  SmartMask|ShiftPointer`` (always passed: v0.6.0 swapped the default and the help text).
- ``qnn-shared-buffer``: v1.1.0 and later; ShiftPointer is gone, ``--shared_buffer`` replaces the flag.
- ``host``: ``farm-llama-runner``, the farm's reference runner, v1.0.1's flags plus ``--token_ids_path``
  and ``--seed``.

The result is one ``sh -c`` string: every argument goes through ``shlex`` quoting, so prompts with
quotes, ``$(...)``, backticks, newlines or any other bytes reach the runner unchanged.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field

from farm.bundle import Bundle
from farm.errors import UsageError
from farm.vocab import Dialect, EvalMode, Updater

UPDATERS: tuple[Updater, ...] = tuple(Updater)
# The updaters each runner dialect can run: ShiftPointer was removed after v1.0.1.
DIALECT_UPDATERS: dict[Dialect, tuple[Updater, ...]] = {d: d.updaters for d in Dialect}
OUTPUTS = "outputs.txt"
SPEED = "inference_speed.txt"
TOKEN_IDS = "token_ids.json"
PIDFILE = "runner.pid"
# adb carries the command in the service name of an OPEN packet; stay well under every adbd's limit.
MAX_COMMAND_BYTES = 60_000


@dataclass(frozen=True)
class RunRequest:
    prompts: list[str]
    mode: str = EvalMode.KV  # a key of the bundle's modes: kv (eval_mode 0), hybrid (eval_mode 1)
    updater: str = Updater.SMART_MASK
    system_prompt: str | None = None
    seq_len: int = 128
    temperature: float = 0.0
    num_iters: int = 1
    seed: int | None = None
    extra_args: list[str] = field(default_factory=list)  # appended verbatim (quoted) for new flags

    def check(self) -> None:
        if not self.prompts:
            raise UsageError("run request: at least one --prompt is needed")
        for text in [*self.prompts, self.system_prompt or ""]:
            if "\0" in text:
                raise UsageError("run request: a prompt contains a NUL byte, which no argv can carry")
        if self.updater not in UPDATERS:
            raise UsageError(f"run request: --updater {self.updater!r} is not one of "
                             f"{', '.join(UPDATERS)}")
        if self.seq_len <= 0:
            raise UsageError(f"run request: --seq-len must be positive, got {self.seq_len}")
        if self.temperature < 0:
            raise UsageError(f"run request: --temperature must be >= 0, got {self.temperature}")
        if self.num_iters <= 0:
            raise UsageError(f"run request: --num-iters must be positive, got {self.num_iters}")


@dataclass(frozen=True)
class RunnerCommand:
    argv: list[str]  # the runner's argv, as the runner will see it
    shell: str  # the whole ``sh -c`` string sent to the device
    out_dir: str  # absolute device path of this run's outputs
    outputs: dict[str, str]  # kind -> file name inside out_dir, for the files this dialect writes


def runner_argv(bundle: Bundle, request: RunRequest, out_rel: str) -> tuple[list[str], dict[str, str]]:
    """The runner's argv for this bundle's dialect; paths relative to the bundle workspace."""
    request.check()
    try:
        dialect = Dialect(bundle.runner_dialect)
    except ValueError:
        raise UsageError(f"{bundle.manifest_path}: unknown runner dialect "
                         f"{bundle.runner_dialect!r}") from None
    if request.mode not in bundle.modes:
        raise UsageError(f"{bundle.manifest_path}: bundle {bundle.name!r} has no mode "
                         f"{request.mode!r} (modes: {', '.join(sorted(bundle.modes))})")
    mode = bundle.modes[request.mode]
    outputs = {"outputs": OUTPUTS, "speed": SPEED}
    if dialect == Dialect.HOST:
        argv = ["farm-llama-runner"]
    else:
        if not bundle.runner:
            raise UsageError(f"{bundle.manifest_path}: dialect '{dialect}' needs field 'runner'")
        argv = ["./" + bundle.runner]
        if request.seed is not None and request.temperature > 0:
            raise UsageError(f"runner dialect '{dialect}' has no --seed: sampling at temperature "
                             f"{request.temperature:g} cannot be made reproducible")
    if request.updater not in dialect.updaters:
        raise UsageError(f"runner dialect '{dialect}' supports only the "
                         f"{' and '.join(dialect.updaters)} updater, not '{request.updater}' "
                         f"(ShiftPointer was removed after v1.0.1)")

    argv += ["--model_path", mode.pte, "--tokenizer_path", bundle.tokenizer,
             "--decoder_model_version", bundle.decoder_model_version]
    for prompt in request.prompts:
        argv += ["--prompt", prompt]
    if request.system_prompt is not None:
        argv += ["--system_prompt", request.system_prompt]
    argv += ["--seq_len", str(request.seq_len), "--temperature", repr(float(request.temperature)),
             "--eval_mode", str(mode.eval_mode), "--num_iters", str(request.num_iters),
             "--output_path", posixpath.join(out_rel, OUTPUTS),
             "--performance_output_path", posixpath.join(out_rel, SPEED)]
    if dialect == Dialect.QNN_SHARED_BUFFER:
        argv.append("--shared_buffer")
    else:
        argv += ["--kv_updater", request.updater]
    if dialect == Dialect.HOST:
        argv += ["--token_ids_path", posixpath.join(out_rel, TOKEN_IDS)]
        outputs["token_ids"] = TOKEN_IDS
        if request.seed is not None:
            argv += ["--seed", str(request.seed)]
    argv += list(request.extra_args)
    return argv, outputs


def build_command(bundle: Bundle, request: RunRequest, workspace: str, run_id: str) -> RunnerCommand:
    """The device command: cd into the bundle workspace, export the library paths, record the pid
    (``exec`` keeps it: the pid of the shell *is* the runner's, so a timeout can kill exactly it)."""
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise UsageError(f"run id {run_id!r} must be a plain name")
    out_rel = posixpath.join("runs", run_id)
    argv, outputs = runner_argv(bundle, request, out_rel)
    out_dir = posixpath.join(workspace, out_rel)
    shell = (f"cd {shlex.quote(workspace)} && export LD_LIBRARY_PATH=. ADSP_LIBRARY_PATH=. && "
             f"mkdir -p {shlex.quote(out_rel)} && echo $$ > {shlex.quote(posixpath.join(out_rel, PIDFILE))} "
             f"&& exec {shlex.join(argv)}")
    size = len(shell.encode())
    if size > MAX_COMMAND_BYTES:
        raise UsageError(f"run request: the command line is {size} bytes, over the "
                         f"{MAX_COMMAND_BYTES}-byte limit of an adb shell command (shorten the prompts)")
    return RunnerCommand(argv=argv, shell=shell, out_dir=out_dir, outputs=outputs)


def kill_command(command: RunnerCommand) -> str:
    """Kill the runner of ``command`` if still alive. The pid is only trusted when its cmdline
    still names this run's output dir, so a recycled pid is never killed."""
    pidfile = shlex.quote(posixpath.join(command.out_dir, PIDFILE))
    marker = shlex.quote(posixpath.basename(command.out_dir))
    return (f"pid=$(cat {pidfile} 2>/dev/null) && [ -n \"$pid\" ] && "
            f"grep -qF -- {marker} /proc/$pid/cmdline 2>/dev/null && kill -9 $pid; true")
