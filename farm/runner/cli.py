"""`farm-llama-runner`: a host stand-in for qnn_llama_runner v1.0.1, observably the same.

    farm-llama-runner --model_path kv_llama_xnnpack.pte --tokenizer_path tokenizer.model \\
        --decoder_model_version llama3 --prompt "Once upon a time" --seq_len 64 --eval_mode 0

As upstream (qnn_llama_runner.cpp, runner/runner.cpp, runner/token_generator.cpp and
extension/llm/runner/stats.h at v1.0.1): each iteration runs each `--prompt` on one runner whose position
carries over; each prompt echoes its formatted string into --output_path, followed by every token's
piece; prints one compact `PyTorchObserver {json}` line and rewrites --performance_output_path (tokens
per second, prefill included, written as `operator<<` writes a double); a newline goes to stdout when
generation reaches an end token. --dump_logits_path writes upstream's layout with the host model's
float32 logits where a phone writes quantized uint16 (farm/runner/logits.py). Flags of ours:
--token_ids_path (JSON with the prompt and generated token ids of the last iteration, so comparisons
can be exact) and --seed.
gflags spellings are accepted: `--flag value`, `--flag=value`, `-flag value`; `--help` prints the flags
in gflags' layout (farm/runner/gflags_help.py, what a phone's runner prints) and exits 1, as gflags does.
Bad input: one line `farm-llama-runner: error: ...` on stderr and exit code 2.

This module is the run in this process (farm.runner.main decides whether a zygote's fork runs it
instead); it imports nothing heavy at its top: torch comes with farm.runner.engine, in run().
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, NamedTuple

from farm.errors import UsageError
from farm.runner import PROG
from farm.runner.gflags_help import usage
from farm.runner.releases import HOST, Flag, Release, split_release

if TYPE_CHECKING:
    import argparse

USAGE = HOST.usage
FLAGS = HOST.flags  # farm-llama-runner's own flags (farm/runner/releases.py has every release's)
_PARSE = {"string": str, "int32": int, "double": float}


def _add(p: argparse.ArgumentParser, flag: Flag, defaults: bool = True) -> None:
    import argparse

    names = (f"--{flag.name}", f"-{flag.name}")
    default = flag.default if defaults else argparse.SUPPRESS
    if flag.type == "bool":
        p.add_argument(*names, dest=flag.name, action="store_true", default=default)
    elif flag.name == "prompt":
        p.add_argument(*names, dest=flag.name, action="append", default=default)
    else:
        p.add_argument(*names, dest=flag.name, type=_PARSE[flag.type], default=default)


def build_parser(defaults: bool = True, release: Release = HOST) -> argparse.ArgumentParser:
    """The flags of ``release``; ``defaults=False``: only the flags given appear in the namespace."""
    # argparse is imported where used: a zygote client never parses, and its start-up is this
    # module's imports.
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):  # one line, never a usage dump
            raise UsageError(message)

    p = Parser(prog=PROG, allow_abbrev=False, add_help=False)
    for flag in release.flags:
        _add(p, flag, defaults)
    return p


def help_text(argv: list[str], release: Release = HOST, prog: str = PROG) -> str:
    """--help as gflags prints it (farm/runner/gflags_help.py); the flags given show "currently"."""
    given = vars(build_parser(defaults=False, release=release).parse_known_args(argv)[0])
    if isinstance(given.get("prompt"), list):
        given["prompt"] = given["prompt"][-1]  # gflags keeps the last value
    return usage(prog, release.flag_infos(), given, release.usage)


def collect_prompts(argv: list[str]) -> list[str]:
    """qnn_llama_runner.cpp CollectPrompts: the value after each argument that is exactly
    ``--prompt``. Only these are run (gflags keeps just the last one): ``--prompt=TEXT`` and
    ``-prompt TEXT`` parse, yet upstream runs no prompt for them, and neither does this runner."""
    prompts, i = [], 0
    while i < len(argv):
        if argv[i] == "--prompt" and i + 1 < len(argv):
            prompts.append(argv[i + 1])
            i += 1  # the value is never itself taken for a flag
        i += 1
    return prompts


def read_tokenized_prompt(path: str) -> list[int]:
    """--tokenized_prompt: the file's bytes as native uint64 token ids (runner.cpp)."""
    import numpy as np

    try:
        raw = open(path, "rb").read()
    except OSError as e:
        raise UsageError(f"--tokenized_prompt: Unable to read tokenized prompt from file: {path} "
                         f"({e.strerror})") from None
    return [int(t) for t in np.frombuffer(raw[: len(raw) // 8 * 8], dtype=np.uint64)]


def _write_atomic(path: str, data: bytes, flag: str) -> None:
    from farm.fileio import write_atomic

    try:
        write_atomic(path, data)
    except OSError as e:
        raise UsageError(f"--{flag}: cannot write {path}: {e.strerror}") from None


def _check_utf8(flag: str, text: str) -> None:
    """An argv byte that is not UTF-8 arrives as a lone surrogate; say so instead of a traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = ord(text[e.start])
        byte = f"byte 0x{bad - 0xDC00:02x}" if 0xDC80 <= bad <= 0xDCFF else f"U+{bad:04X}"
        raise UsageError(f"--{flag}: not valid UTF-8 ({byte} at character {e.start})") from None


def unknown_flag(argv: list[str], release: Release) -> str | None:
    """The first ``-name``/``--name`` argument naming no flag of ``release`` (gflags reads both
    spellings, ``name=value`` too), where a flag is expected: a value after a flag that takes one is
    skipped, as gflags skips it."""
    known = {f.name: f for f in release.flags}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return None
        if arg.startswith("-") and len(arg) > 1:
            name, eq, _ = arg.lstrip("-").partition("=")
            flag = known.get(name)
            if flag is None and not (name.startswith("no") and name[2:] in known):
                return name
            if flag is not None and flag.type != "bool" and not eq:
                i += 1  # its value, whatever it looks like
        i += 1
    return None


class GflagsExit(UsageError):
    """A command line gflags refuses: printed as gflags prints it, then exit 1 (gflags.cc
    ParseNewCommandLineFlags: "ERROR: unknown command line flag 'NAME'"), not as our own refusals."""


def run(argv: list[str]) -> int:
    release, argv = split_release(argv)
    if release.gflags_errors and (name := unknown_flag(argv, release)) is not None:
        raise GflagsExit(f"ERROR: unknown command line flag '{name}'")
    args = build_parser(release=release).parse_args(argv)
    if args.help or args.helpfull:
        sys.stdout.write(help_text(argv, release, PROG if release is HOST else release.program))
        return 1  # gflags exits 1 after --help (gflags_reporting.cc HandleCommandLineHelpFlags)
    given = vars(build_parser(defaults=False, release=release).parse_args(argv))
    if "dump_logits_path" in given and args.eval_mode != 0:
        # qnn_llama_runner.cpp:247-251: the flag given at all (even empty) needs eval_mode 0.
        raise UsageError("--dump_logits_path: Only TokenGenerator(kv) mode is supported to dump all "
                         f"logits. Use --eval_mode 0, not {args.eval_mode}.")
    prompts = collect_prompts(argv)
    for prompt in prompts:
        _check_utf8("prompt", prompt)
    _check_utf8("system_prompt", args.system_prompt)
    if args.prompt and args.tokenized_prompt:
        raise UsageError("Only provide prompt or tokenized_input but not both.")
    if args.num_iters < 1:
        raise UsageError(f"--num_iters: must be at least 1, got {args.num_iters}")
    if release.multimodal:  # qnn_multimodal_runner (farm/runner/multimodal.py)
        from farm.runner import multimodal

        return multimodal.run(args, prompts, release, _write_atomic)
    # Absent from a release's flags: its only updater (v1.4.1: SmartMask), no seed of ours (0).
    args.kv_updater = getattr(args, "kv_updater", release.updaters[0])
    args.seed = getattr(args, "seed", 0)
    args.token_ids_path = getattr(args, "token_ids_path", "")
    import torch

    from farm.runner.engine import LlamaRunner, cpp_double, updater_class
    from farm.runner.lookahead import LookaheadConfig
    from farm.runner.timing import simulated_phone

    io_cls = updater_class(args.kv_updater)
    runner = LlamaRunner(args.model_path, args.tokenizer_path, args.eval_mode, io_cls,
                         args.decoder_model_version, dump_logits=bool(args.dump_logits_path),
                         lookahead=LookaheadConfig(args.ngram, args.window, args.gcap), seed=args.seed,
                         upstream=release.templates, kv_method=release.kv_method,
                         # v1.4.1's flag (qnn_llama_runner.cpp:31-34): the evictor, farm/runner/attention_sink.py
                         attention_sink_rope_path=getattr(args, "attention_sink_rope_path", ""))
    if release.v14_layout_only and not runner.v14:
        # What a phone's v1.4.1 runner cannot read either: it takes the mask's sizes[3] and a cache per
        # layer from the shapes, which v1.0.1's programs (a 3-D mask, a cache per head) do not have.
        raise UsageError(f"--model_path: {args.model_path} is in v1.0.1's I/O layout (a 3-D mask, a cache "
                         "per layer and head): qnn_llama_runner v1.4.1 runs 1.4.1's (farm export --layout v1.4)")
    gen = torch.Generator().manual_seed(args.seed)
    text = bytearray()
    last_iteration = []
    # qnn_llama_runner.cpp start_runner: every iteration runs every prompt on one runner, whose
    # position carries over; each prompt prints its observer line and rewrites the speed file.
    calls = ([(args.tokenized_prompt, read_tokenized_prompt(args.tokenized_prompt))]
             if args.tokenized_prompt else [(p, None) for p in prompts])
    for i in range(1 if args.tokenized_prompt else args.num_iters):
        last_iteration = []
        for prompt, tokens in calls:
            echo = prompt if tokens is not None else runner.template.format(prompt, args.system_prompt)
            with simulated_phone(runner, args):
                gen_ = runner.generate(echo, args.seq_len, args.temperature, gen, tokens)
            text += gen_.text
            last_iteration.append(gen_)
            # token_generator.cpp prints a newline at EOS (v1.4.1: or when seq_len ends it, so always
            # one); lhd_token_generator.cpp two, or one when the context ends the generation.
            newlines = gen_.newlines
            if release.newline_at_limit and runner.lookahead is None:
                newlines = 1
            sys.stdout.write("\n" * newlines)
            print(gen_.stats.observer_line(rates=release.observer_rates), flush=True)
            _write_atomic(args.performance_output_path,
                          cpp_double(gen_.stats.tokens_per_second()).encode(), "performance_output_path")
            if args.dump_logits_path:  # runner.cpp:456-460: rewritten after every prompt
                _write_atomic(args.dump_logits_path, runner.logits_dump(), "dump_logits_path")
    _write_atomic(args.output_path, bytes(text), "output_path")
    if args.token_ids_path and last_iteration:
        ids = {"prompt_ids": [t for g in last_iteration for t in g.prompt_ids],
               "generated_ids": [t for g in last_iteration for t in g.generated_ids]}
        _write_atomic(args.token_ids_path, json.dumps(ids).encode(), "token_ids_path")
    return 0


def exit_code(argv: list[str]) -> int:
    """Run in this process; the exit code (also what a zygote's child runs)."""
    try:
        return run(argv)
    except UsageError as e:  # ours: one line and exit 2; gflags' as gflags prints it, exit 1
        line, code = (str(e), 1) if isinstance(e, GflagsExit) else (f"{PROG}: error: {e}", 2)
        print(line, file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return 130
