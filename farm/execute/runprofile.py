"""Runner dialects: how a run request becomes the command line of one runner build.

Three dialects exist (see the ExecuTorch fact sheet):

- ``qnn-v1.0``: ``./qnn_llama_runner`` of releases v0.7 .. v1.0.1, takes ``--kv_updater
  SmartMask|ShiftPointer`` (always passed: v0.6.0 swapped the default and the help text).
- ``qnn-v1.4``: v1.1.0 and later; ShiftPointer is gone, ``--shared_buffer`` replaces the flag.
- ``host``: ``farm-llama-runner``, the farm's reference runner, v1.0.1's flags plus ``--token_ids_path``
  and ``--seed``.

The dialect only decides the flags: the binary is always the bundle's declared ``runner`` (``./NAME`` in
its workspace), and ``farm-llama-runner`` from PATH only for a bundle that declares none.

A manifest may say ``"runner_dialect": "auto"`` (or, for a QNN runner, leave it out): the dialect is then
read from the runner's own ``--help`` on the device (``detect_dialect``; farm.execute.run asks once per runner
and device). A declared dialect is checked the same way: a runner whose help names another dialect's
flag is a ``UsageError`` (``settle_dialect``); a help that names none (a stand-in script) leaves the
declaration standing.

The result is one ``sh -c`` string: every argument goes through ``shlex`` quoting, so prompts with
quotes, ``$(...)``, backticks, newlines or any other bytes reach the runner unchanged.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field

from farm.bundle.manifest import AUTO_DIALECT, HOST_RUNNER, Bundle
from farm.errors import UsageError
from farm.vocab import Dialect, EvalMode, Updater

UPDATERS: tuple[Updater, ...] = tuple(Updater)
# The updaters each runner dialect can run: ShiftPointer was removed after v1.0.1.
DIALECT_UPDATERS: dict[Dialect, tuple[Updater, ...]] = {d: d.updaters for d in Dialect}
OUTPUTS = "outputs.txt"
SPEED = "inference_speed.txt"
TOKEN_IDS = "token_ids.json"
LOGITS = "logits.bin"  # --dump_logits_path: farm/runner/logits.py has upstream's layout
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
    # --dump_logits_path: every step's logits (upstream takes it with --eval_mode 0 only)
    dump_logits: bool = False
    # A multimodal bundle's input (a key of its manifest's multimodal.inputs: an input list of images)
    media: str | None = None
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


# -- the dialect from the runner's own --help ------------------------------------------------------

# One flag entry: gflags starts it with four spaces, ``    -name (help) type: ... default: ...`` (the
# gflags v1.0.1 links; releases after 2.2.2 print ``    --name (``), and indents wrapped lines by six
# (farm-llama-runner prints the same layout: farm/runner/gflags_help.py); argparse with two,
# ``  --name VALUE, -name VALUE`` (or ``  -h, --help``), its wrapped help by 24. So a flag named inside another flag's help text, even at the start of a
# wrapped line, is never taken for a declared one.
_FLAG_ENTRY = re.compile(r"^(?: {4}--?([A-Za-z][A-Za-z0-9_]*) \(| {2}(?:-[A-Za-z], )?--([A-Za-z][A-Za-z0-9_]*)\b)",
                         re.M)
# The flag that tells each dialect apart, in the order they are tried (see detect_dialect).
DIALECT_FLAGS: tuple[tuple[str, Dialect], ...] = (
    ("token_ids_path", Dialect.HOST),             # farm-llama-runner only
    ("kv_updater", Dialect.QNN_V1_0),             # v0.6.0 .. v1.0.x
    ("shared_buffer", Dialect.QNN_V1_4),  # v1.1.0 on
)


def help_flags(help_text: str) -> set[str]:
    """The flag names a runner's ``--help`` declares (gflags or argparse layout)."""
    return {a or b for a, b in _FLAG_ENTRY.findall(help_text)}


def detect_dialect(help_text: str) -> Dialect:
    """The dialect of the runner that printed ``help_text`` for ``--help``.

    ``--token_ids_path`` is the host runner's; ``--kv_updater`` means v0.6 .. v1.0.x, whatever its
    help text and default say (v0.6.0 swapped them, so the farm always passes the flag); otherwise
    ``--shared_buffer`` means v1.1 or later. A runner declaring both still takes ``--kv_updater``,
    the flag that can choose either updater. ``UsageError`` when the help names none of them."""
    flags = help_flags(help_text)
    for flag, dialect in DIALECT_FLAGS:
        if flag in flags:
            return dialect
    if "kv_updator" in flags:
        raise UsageError("the runner takes --kv_updator: it predates ExecuTorch v0.6.0 (the flag was "
                         "renamed --kv_updater), which the farm does not drive")
    listed = ", ".join(sorted(flags)[:12]) or "no flag at all"
    raise UsageError(f"its --help lists none of {', '.join('--' + f for f, _ in DIALECT_FLAGS)} "
                     f"(it lists {listed})")


def help_names_dialect(help_text: str) -> bool:
    """Whether ``detect_dialect`` can tell anything from this text."""
    flags = help_flags(help_text)
    return any(flag in flags for flag, _ in DIALECT_FLAGS)


def runner_path(bundle: Bundle) -> str:
    """How the workspace runs the bundle's runner: ``./NAME``, or the host runner from PATH."""
    return "./" + bundle.runner if bundle.runner else HOST_RUNNER


HELP_PIDFILE = ".runner-help.pid"  # in the workspace: the pid of a --help that may hang, to kill it


def help_command(bundle: Bundle, workspace: str) -> str:
    """``--help`` of the bundle's runner, run as a real run would be (in the workspace, with its
    libraries): a runner that needs its backend library to start must find it here too. Its pid is
    recorded (``exec`` keeps the shell's), so a runner that hangs at start can be killed."""
    return (f"cd {shlex.quote(workspace)} && export LD_LIBRARY_PATH=. ADSP_LIBRARY_PATH=. && "
            f"echo $$ > {HELP_PIDFILE} && exec {shlex.quote(runner_path(bundle))} --help 2>&1")


def settle_dialect(bundle: Bundle, help_text: str, device: str, exit_code: int | None = None) -> Dialect:
    """The dialect to drive the bundle's runner with, given what its ``--help`` printed on
    ``device`` (and its exit code, for the message): the detected one for ``auto``; the declared
    one unless the help contradicts it."""
    declared = bundle.runner_dialect
    where = f"{bundle.manifest_path or bundle.name}: runner {runner_path(bundle)} on {device}"
    try:
        detected = detect_dialect(help_text)
    except UsageError as e:
        if declared != AUTO_DIALECT:
            return Dialect(declared)  # nothing in the help to contradict the manifest
        lines = [line.strip() for line in help_text.splitlines() if line.strip()]
        said = f"; --help exited {exit_code}" if exit_code is not None else ""
        said += f": {lines[-1][:200]}" if lines else ", printing nothing"
        raise UsageError(f"{where}: cannot tell its dialect ('runner_dialect' is 'auto'): {e}{said}; "
                         f"deploy the bundle first, or declare the manifest's 'runner_dialect'") \
            from None
    if declared not in (AUTO_DIALECT, detected):
        raise UsageError(f"{where}: the manifest's 'runner_dialect' is {declared!r} but the runner "
                         f"is {str(detected)!r} (its --help lists "
                         f"--{next(f for f, d in DIALECT_FLAGS if d == detected)}); fix the "
                         f"manifest or set 'runner_dialect' to 'auto'")
    return detected


# -- command lines ----------------------------------------------------------------------------------

def runner_argv(bundle: Bundle, request: RunRequest, out_rel: str,
                dialect: Dialect | str | None = None) -> tuple[list[str], dict[str, str]]:
    """The runner's argv for ``dialect`` (default: the bundle's declared one; an ``auto`` bundle's is
    settled on the device first, see farm.execute.run.runner_dialect); paths relative to the workspace."""
    request.check()
    name = dialect or bundle.runner_dialect
    if name == AUTO_DIALECT:
        raise UsageError(f"{bundle.manifest_path}: runner dialect 'auto' is read from the runner on a "
                         f"device: deploy it first (farm.execute.run.runner_dialect)")
    try:
        dialect = Dialect(name)
    except ValueError:
        raise UsageError(f"{bundle.manifest_path}: unknown runner dialect {name!r}") from None
    if request.mode not in bundle.modes:
        raise UsageError(f"{bundle.manifest_path}: bundle {bundle.name!r} has no mode "
                         f"{request.mode!r} (modes: {', '.join(sorted(bundle.modes))})")
    mode = bundle.modes[request.mode]
    if bundle.multimodal is not None:
        return multimodal_argv(bundle, request, out_rel, dialect), {"outputs": OUTPUTS, "speed": SPEED}
    if request.media is not None:
        raise UsageError(f"{bundle.manifest_path}: bundle {bundle.name!r} is not multimodal: it takes no "
                         f"input {request.media!r}")
    outputs = {"outputs": OUTPUTS, "speed": SPEED}
    # The dialect decides the flags, never the binary: a bundle that declares a runner runs that runner,
    # even one that speaks the host runner's flags (a wrapper passing --help through to it), or the
    # bundle's own runner would never be exercised while its run passed.
    argv = [runner_path(bundle)]
    if dialect != Dialect.HOST:
        if not bundle.runner:
            raise UsageError(f"{bundle.manifest_path}: dialect '{dialect}' needs field 'runner'")
        if request.seed is not None and request.temperature > 0:
            raise UsageError(f"runner dialect '{dialect}' has no --seed: sampling at temperature "
                             f"{request.temperature:g} cannot be made reproducible")
    if request.updater not in dialect.updaters:
        raise UsageError(f"runner dialect '{dialect}' supports only the "
                         f"{' and '.join(dialect.updaters)} updater, not '{request.updater}' "
                         f"(ShiftPointer was removed after v1.0.1)")

    argv += ["--model_path", mode.pte, "--tokenizer_path", bundle.tokenizer,
             "--decoder_model_version", bundle.decoder_model_version]
    argv += generation_args(request, mode, out_rel)
    argv += mode.lookahead_args  # eval_mode 2: the --ngram/--window/--gcap its .pte was exported for
    argv += attention_sink_args(bundle, request, dialect)
    if dialect == Dialect.QNN_V1_4:
        argv.append("--shared_buffer")
    else:
        argv += ["--kv_updater", request.updater]
    if request.dump_logits:
        if mode.eval_mode != 0:  # qnn_llama_runner.cpp:247-251 refuses it in any other mode
            raise UsageError(f"run request: logits are dumped only in eval_mode 0 (upstream's "
                             f"runner refuses --dump_logits_path otherwise); mode {request.mode!r} is "
                             f"eval_mode {mode.eval_mode}")
        argv += ["--dump_logits_path", posixpath.join(out_rel, LOGITS)]
        outputs["logits"] = LOGITS
    if dialect == Dialect.HOST:
        argv += ["--token_ids_path", posixpath.join(out_rel, TOKEN_IDS)]
        outputs["token_ids"] = TOKEN_IDS
        if request.seed is not None:
            argv += ["--seed", str(request.seed)]
    argv += list(request.extra_args)
    return argv, outputs


def generation_args(request: RunRequest, mode, out_rel: str) -> list[str]:
    """The flags qnn_llama_runner and qnn_multimodal_runner share: the prompts (one ``--prompt``
    each, as upstream's CollectPrompts reads them), the generation and the output files."""
    argv = []
    for prompt in request.prompts:
        argv += ["--prompt", prompt]
    if request.system_prompt is not None:
        argv += ["--system_prompt", request.system_prompt]
    return argv + ["--seq_len", str(request.seq_len), "--temperature", repr(float(request.temperature)),
                   "--eval_mode", str(mode.eval_mode), "--num_iters", str(request.num_iters),
                   "--output_path", posixpath.join(out_rel, OUTPUTS),
                   "--performance_output_path", posixpath.join(out_rel, SPEED)]


MULTIMODAL_EMULATION = "--ptefarm_upstream=multimodal-v1.4.1"  # farm/runner/releases.py MULTIMODAL_V1_4_1


def multimodal_argv(bundle: Bundle, request: RunRequest, out_rel: str, dialect: Dialect) -> list[str]:
    """qnn_multimodal_runner's argv (ExecuTorch 1.4.1, device_evaluator.py:185-206 and
    _init_multimodal_base_cmd): the decoder, encoder and token embedding programs, the input list of
    the request's ``media``. v1.1 and later only; the host runner shows itself as v1.4.1's."""
    mm = bundle.multimodal
    where = f"{bundle.manifest_path or bundle.name}"
    if dialect == Dialect.QNN_V1_0:
        raise UsageError(f"{where}: a multimodal bundle needs qnn_multimodal_runner (ExecuTorch 1.1 and "
                         f"later), not runner dialect 'qnn-v1.0'")
    if request.media is None or request.media not in mm.inputs:
        raise UsageError(f"{where}: a {mm.modality} bundle runs with one of its inputs "
                         f"({', '.join(sorted(mm.inputs)) or 'none listed'}), got {request.media!r}")
    if request.seed is not None and request.temperature > 0:
        raise UsageError("qnn_multimodal_runner has no --seed: sampling at temperature "
                         f"{request.temperature:g} cannot be made reproducible")
    mode = bundle.modes[request.mode]
    argv = [runner_path(bundle)] + ([] if bundle.runner else [MULTIMODAL_EMULATION])
    argv += ["--decoder_path", mode.pte, "--encoder_path", mm.encoder, "--tok_embedding_path", mm.tok_embedding,
             "--tokenizer_path", bundle.tokenizer, "--decoder_model_version", bundle.decoder_model_version]
    argv += generation_args(request, mode, out_rel)
    argv += ["--shared_buffer", f"--{mm.input_flag}", mm.inputs[request.media]]
    if request.dump_logits:
        raise UsageError("run request: the farm does not dump a multimodal run's logits yet")
    return argv + list(request.extra_args)


def attention_sink_args(bundle: Bundle, request: RunRequest, dialect: Dialect) -> list[str]:
    """``--attention_sink_rope_path`` for a run that generates past the context window, where the mode
    has an evictor. Only then: without it v1.4.1's runner stops at the context (runner.cpp:393-409), and
    a run within the context is the same either way, so every other run stays as before. A run past the
    context that cannot have it is bad input: the runner would end it at the context, and a test of
    generation past it would pass on tokens it never generated."""
    context = bundle.context()
    if context is None or request.seq_len <= context[0]:
        return []
    mode = bundle.modes[request.mode]
    where = f"{bundle.manifest_path or bundle.name}: mode {request.mode!r}"
    if mode.attention_sink_rope is None:
        raise UsageError(f"{where}: seq_len {request.seq_len} is past the context ({context[0]}) and the "
                         f"mode has no 'attention_sink_rope' evictor to generate past it with")
    if dialect == Dialect.QNN_V1_0:
        raise UsageError(f"{where}: seq_len {request.seq_len} is past the context ({context[0]}): runner "
                         f"dialect 'qnn-v1.0' has no --attention_sink_rope_path (added in v1.1)")
    return mode.attention_sink_args


def build_command(bundle: Bundle, request: RunRequest, workspace: str, out_name: str,
                  dialect: Dialect | str | None = None) -> RunnerCommand:
    """The device command: cd into the bundle workspace, export the library paths, record the pid
    (``exec`` keeps it: the pid of the shell *is* the runner's, so a timeout can kill exactly it)."""
    if not out_name or "/" in out_name or out_name.startswith("."):
        raise UsageError(f"output folder name {out_name!r} must be a plain name")
    out_rel = posixpath.join("runs", out_name)
    argv, outputs = runner_argv(bundle, request, out_rel, dialect)
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
