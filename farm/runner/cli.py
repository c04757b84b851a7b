"""`farm-llama-runner`: a host stand-in for qnn_llama_runner v1.0.1, observably the same.

    farm-llama-runner --model_path kv_llama_xnnpack.pte --tokenizer_path tokenizer.model \\
        --decoder_model_version llama3 --prompt "Once upon a time" --seq_len 64 --eval_mode 0

As upstream (qnn_llama_runner.cpp, runner/runner.cpp, runner/token_generator.cpp and
extension/llm/runner/stats.h at v1.0.1): each iteration runs each `--prompt` on one runner whose position
carries over; each prompt echoes its formatted string into --output_path, followed by every token's
piece; prints one compact `PyTorchObserver {json}` line and rewrites --performance_output_path (tokens
per second, prefill included, written as `operator<<` writes a double); a newline goes to stdout when
generation reaches an end token. Flags of ours: --token_ids_path (JSON with the prompt and generated
token ids of the last iteration, so comparisons can be exact) and --seed.
gflags spellings are accepted: `--flag value`, `--flag=value`, `-flag value`.
Bad input: one line `farm-llama-runner: error: ...` on stderr and exit code 2.

This module is the run in this process (farm.runner.main decides whether a zygote's fork runs it
instead); it imports nothing heavy at its top: torch comes with farm.runner.engine, in run().
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from farm.errors import UsageError

if TYPE_CHECKING:
    import argparse

PROG = "farm-llama-runner"


def _flag(p: argparse.ArgumentParser, name: str, **kw) -> None:
    p.add_argument(f"--{name}", f"-{name}", dest=name, **kw)


def build_parser() -> argparse.ArgumentParser:
    # argparse (and farm.fileio below) are imported where used: a zygote client never parses, and
    # its start-up is this module's imports.
    import argparse

    from farm.vocab import Updater

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):  # one line, never a usage dump
            raise UsageError(message)

    # The defaults are qnn_llama_runner.cpp's gflags defaults at v1.0.1.
    p = Parser(prog=PROG, allow_abbrev=False, description=__doc__.split("\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    _flag(p, "model_path", default="kv_llama_qnn.pte", help="Model serialized in flatbuffer format.")
    _flag(p, "tokenizer_path", default="tokenizer.bin", help="tiktoken tokenizer.model")
    _flag(p, "decoder_model_version", default="llama2",
          help="The decoder model to execute (chat template and end tokens).")
    _flag(p, "prompt", action="append",
          help="User prompts; repeat `--prompt TEXT` for a multi-turn conversation.")
    _flag(p, "tokenized_prompt", default="",
          help="Instead of prompts: a raw file of token ids saved as uint64.")
    _flag(p, "system_prompt", default="")
    _flag(p, "seq_len", type=int, default=128,
          help="Total number of tokens to generate (prompt + output); clamped to the context length.")
    _flag(p, "temperature", type=float, default=0.0, help="0 = greedy argmax sampling")
    _flag(p, "eval_mode", type=int, default=1, help="0: kv / 1: hybrid (prefill+kv)")
    _flag(p, "kv_updater", default=Updater.SMART_MASK.value, help=" | ".join(Updater))
    _flag(p, "output_path", default="outputs.txt")
    _flag(p, "performance_output_path", default="inference_speed.txt")
    _flag(p, "num_iters", type=int, default=1)
    _flag(p, "token_ids_path", default="", help="(ptefarm) write prompt/generated token ids as JSON")
    _flag(p, "seed", type=int, default=0, help="(ptefarm) sampling seed for --temperature > 0")
    return p


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


def run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    prompts = collect_prompts(argv)
    for prompt in prompts:
        _check_utf8("prompt", prompt)
    _check_utf8("system_prompt", args.system_prompt)
    if args.prompt and args.tokenized_prompt:
        raise UsageError("Only provide prompt or tokenized_input but not both.")
    if args.num_iters < 1:
        raise UsageError(f"--num_iters: must be at least 1, got {args.num_iters}")
    import torch

    from farm.runner.engine import LlamaRunner, cpp_double, updater_class

    io_cls = updater_class(args.kv_updater)
    runner = LlamaRunner(args.model_path, args.tokenizer_path, args.eval_mode, io_cls,
                         args.decoder_model_version)
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
            gen_ = runner.generate(echo, args.seq_len, args.temperature, gen, tokens)
            text += gen_.text
            last_iteration.append(gen_)
            if gen_.reached_eos:
                sys.stdout.write("\n")  # token_generator.cpp prints a newline at EOS
            print(gen_.stats.observer_line(), flush=True)
            _write_atomic(args.performance_output_path,
                          cpp_double(gen_.stats.tokens_per_second()).encode(), "performance_output_path")
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
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
