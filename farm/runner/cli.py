"""`farm-llama-runner`: a host stand-in for qnn_llama_runner v1.0.1 with the same flags and output files.

    farm-llama-runner --model_path kv_llama_xnnpack.pte --tokenizer_path tokenizer.model \\
        --prompt "Once upon a time" --seq_len 64 --eval_mode 0 --kv_updater SmartMask

Writes --output_path (echoed prompt + generated text, all iterations), --performance_output_path (one
float: tokens/second of the last iteration, prefill included, as upstream) and prints one
`PyTorchObserver {json}` line per iteration on stdout. Flags of ours: --token_ids_path (JSON with the
prompt and generated token ids of the last iteration, so comparisons can be exact) and --seed.
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

    p = Parser(prog=PROG, allow_abbrev=False, description=__doc__.split("\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    _flag(p, "model_path", default="kv_llama_qnn.pte", help="the .pte program")
    _flag(p, "tokenizer_path", default="tokenizer.model", help="tiktoken tokenizer.model")
    _flag(p, "decoder_model_version", default="llama3", help="llama2 | llama3 (template, end tokens)")
    _flag(p, "prompt", action="append", help="prompt; repeat for more turns")
    _flag(p, "system_prompt", default="")
    _flag(p, "seq_len", type=int, default=128, help="prompt + generated tokens")
    _flag(p, "temperature", type=float, default=0.8, help="0 = greedy argmax")
    _flag(p, "eval_mode", type=int, default=0, help="0 = kv, 1 = hybrid")
    _flag(p, "kv_updater", default=Updater.SMART_MASK.value, help=" | ".join(Updater))
    _flag(p, "output_path", default="outputs.txt")
    _flag(p, "performance_output_path", default="inference_speed.txt")
    _flag(p, "num_iters", type=int, default=1)
    _flag(p, "token_ids_path", default="", help="(ptefarm) write prompt/generated token ids as JSON")
    _flag(p, "seed", type=int, default=0, help="(ptefarm) sampling seed for --temperature > 0")
    return p


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
    for prompt in args.prompt or []:
        _check_utf8("prompt", prompt)
    _check_utf8("system_prompt", args.system_prompt)
    if args.num_iters < 1:
        raise UsageError(f"--num_iters: must be at least 1, got {args.num_iters}")
    from farm.runner.engine import LlamaRunner, updater_class

    io_cls = updater_class(args.kv_updater)
    runner = LlamaRunner(args.model_path, args.tokenizer_path, args.eval_mode, io_cls,
                         args.decoder_model_version)
    prompts = args.prompt or ["The answer to the ultimate question is"]
    text = bytearray()
    gen = None
    for i in range(args.num_iters):
        gen = runner.generate(prompts, args.system_prompt, args.seq_len, args.temperature,
                              args.seed + i)
        text += gen.text
        print("PyTorchObserver " + json.dumps(gen.stats.to_json()), flush=True)
    _write_atomic(args.output_path, bytes(text), "output_path")
    _write_atomic(args.performance_output_path, f"{gen.stats.tokens_per_second():f}".encode(),
                  "performance_output_path")
    if args.token_ids_path:
        ids = {"prompt_ids": gen.prompt_ids, "generated_ids": gen.generated_ids}
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
