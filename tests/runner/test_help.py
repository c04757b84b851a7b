"""farm-llama-runner --help reads as a phone's qnn_llama_runner --help: gflags' layout, exit 1.

The layout is gflags v2.2.2-47's (the gflags ExecuTorch v1.0.1 links: third-party/gflags at a738fdf),
src/gflags_reporting.cc: ShowUsageWithFlagsMatching (GFR:214-246) and DescribeOneFlag (GFR:118-174).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from farm.execute.runprofile import detect_dialect, help_flags
from farm.runner import cli
from farm.runner.gflags_help import FlagInfo, describe_flag, usage
from farm.vocab import Dialect
from tests.support import runner_help_texts as transcripts

QLR = "/executorch/examples/qualcomm/oss_scripts/llama/qnn_llama_runner.cpp"
GFLAGS = "external/gflags/src/"

# qnn_llama_runner.cpp v1.0.1 lines 26-84 and gflags' own DEFINE_* lines (gflags.cc:119-128,
# gflags_completions.cc:68-73, gflags_reporting.cc:65-72), in declaration order: the layout sorts.
V1_0_1_FLAGS = [FlagInfo(n, t, d, h, QLR) for n, t, d, h in [
    ("decoder_model_version", "string", "llama2", "The decoder model to execute."),
    ("model_path", "string", "kv_llama_qnn.pte", "Model serialized in flatbuffer format."),
    ("output_path", "string", "outputs.txt", "Executorch inference data output path."),
    ("performance_output_path", "string", "inference_speed.txt",
     "Records inference speed. For CI purpose."),
    ("dump_logits_path", "string", "", "If path is provided, program will dump all logits generated. "
     "This option is for analysis purpose. It is not recommended for general usage as it will cause "
     "token rate drop and increase in memory usage."),
    ("tokenizer_path", "string", "tokenizer.bin", "Tokenizer stuff."),
    ("prompt", "string", "The answer to the ultimate question is", "User prompts for Llama. When "
     "multiple prompts are entered, a multi-turn conversation will be initiated. Note that this "
     "feature is currently for testing purposes only."),
    ("tokenized_prompt", "string", "", "This is an alternative of passing prompts. Users could "
     "provide this in a raw file, with tokens saved in uint64 format."),
    ("system_prompt", "string", "", "Tells the model what kind of assistant it should be. For "
     "example, You are a helpful AI assistant for travel tips and recommendations. Default is None"),
    ("temperature", "double", 0.0, "Temperature; Default is 0.0f. 0 = greedy argmax sampling "
     "(deterministic). Lower temperature = more deterministic"),
    ("seq_len", "int32", 128, "Total number of tokens to generate (prompt + output)."),
    ("eval_mode", "int32", 1,
     "0: TokenGenerator(kv) / 1: HybridMode (prefill+kv) / 2: Lookahead Decoding"),
    ("kv_updater", "string", "SmartMask",
     "How to update kv cache. Choose between SmartMask and ShiftPointer"),
    ("num_iters", "int32", 1, "total num of iterations to run."),
    ("ngram", "int32", 0, "[Lookahead Decoding] Represents the size of the n-grams used in the "
     "lookahead process."),
    ("window", "int32", 0, "[Lookahead Decoding] Determines how many future tokens the algorithm "
     "attempts to predict in each step."),
    ("gcap", "int32", 0, "[Lookahead Decoding] Represents the maximum number of speculations or "
     "candidate n-grams that the algorithm considers in each step for verification. It balances the "
     "trade-off between computation efficiency and exploring more possibilities."),
]] + [FlagInfo(n, t, d, h, GFLAGS + f) for f, n, t, d, h in [
    ("gflags.cc", "flagfile", "string", "", "load flags from file"),
    ("gflags.cc", "fromenv", "string", "",
     "set flags from the environment [use 'export FLAGS_flag1=value']"),
    ("gflags.cc", "tryfromenv", "string", "", "set flags from the environment if present"),
    ("gflags.cc", "undefok", "string", "", "comma-separated list of flag names that it is okay to "
     "specify on the command line even if the program does not define a flag with that name.  "
     "IMPORTANT: flags in this list that have arguments MUST use the flag=value format"),
    ("gflags_completions.cc", "tab_completion_word", "string", "", "If non-empty, "
     "HandleCommandLineCompletions() will hijack the process and attempt to do bash-style command "
     "line flag completion on this value."),
    ("gflags_completions.cc", "tab_completion_columns", "int32", 80,
     "Number of columns to use in output for tab completion"),
    ("gflags_reporting.cc", "help", "bool", False,
     "show help on all flags [tip: all flags can have two dashes]"),
    ("gflags_reporting.cc", "helpfull", "bool", False, "show help on all flags -- same as -help"),
    ("gflags_reporting.cc", "helpshort", "bool", False,
     "show help on only the main module for this program"),
    ("gflags_reporting.cc", "helpon", "string", "", "show help on the modules named by this flag value"),
    ("gflags_reporting.cc", "helpmatch", "string", "",
     "show help on modules whose name contains the specified substr"),
    ("gflags_reporting.cc", "helppackage", "bool", False, "show help on all modules in the main package"),
    ("gflags_reporting.cc", "helpxml", "bool", False, "produce an xml version of help"),
    ("gflags_reporting.cc", "version", "bool", False, "show version and build info and exit"),
]]


def test_the_layout_reproduces_a_v1_0_1_runners_help():
    # Files sorted (/executorch... before external/...), flags sorted within each, wrapped below 80
    # columns, two blank lines where the directory changes, "currently: true" on -help itself.
    text = usage("qnn_llama_runner", V1_0_1_FLAGS, {"help": True})
    assert text == transcripts.QNN_V1_0_1
    assert all(len(line) < 80 for line in text.splitlines() if line.startswith("    "))


def test_an_entry_wraps_where_gflags_wraps():
    flag = FlagInfo("seq_len", "int32", 128, "Total number of tokens to generate (prompt + output).", "f")
    # 72 characters up to ")", so " type: int32" would reach column 84: it starts a new line.
    assert describe_flag(flag) == ("    -seq_len (Total number of tokens to generate (prompt + output).)\n"
                                   "      type: int32 default: 128\n")
    # A line of exactly 79 characters stays whole (GFR: "< kLineLength"); one of 80 breaks.
    fits = FlagInfo("a", "bool", False, "x" * 70, "f")  # "    -a (" + 70 + ")" = 79 characters
    assert describe_flag(fits).splitlines()[0] == "    -a (" + "x" * 70 + ")"
    # A word longer than a line: broken after "-b", then the word goes out whole (GFR:146-152).
    word = FlagInfo("b", "string", "", "y" * 100, "f")
    assert describe_flag(word) == "    -b\n      (" + "y" * 100 + ")\n      type: string default: \"\"\n"
    lines = FlagInfo("c", "double", 0.5, "first line\nsecond line", "f")  # a newline in the help
    assert describe_flag(lines, 0.25, is_default=False) == (
        "    -c (first line\n      second line) type: double default: 0.5 currently: 0.25\n")


def _host_help(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "farm.runner.main", *argv], capture_output=True,
                          text=True, timeout=120)


def test_host_runner_help_is_gflags_help_on_stdout_and_exits_1():
    proc = _host_help("--help")
    assert proc.returncode == 1, proc.stderr  # gflags_exitfunc(1) after the help (GFR:424-427)
    assert proc.stderr == ""
    assert proc.stdout == transcripts.HOST_RUNNER
    assert proc.stdout.startswith("farm-llama-runner: a host stand-in for qnn_llama_runner v1.0.1")
    assert "\n  Flags from farm/runner/cli.py:\n    -decoder_model_version (" in proc.stdout
    assert detect_dialect(proc.stdout) is Dialect.HOST


def test_host_runner_help_lists_every_v1_0_1_flag_with_upstreams_default():
    entries = {describe_flag(f) for f in V1_0_1_FLAGS if f.filename == QLR}
    for entry in entries:  # each upstream entry appears, word for word
        assert entry in transcripts.HOST_RUNNER, entry
    # ... and the flags it lists are the flags it takes: no more, no fewer.
    assert help_flags(transcripts.HOST_RUNNER) == {f.name for f in cli.FLAGS}
    parser_flags = {a.dest for a in cli.build_parser()._actions}
    assert parser_flags == {f.name for f in cli.FLAGS}


@pytest.mark.parametrize("argv", [["-help"], ["--helpfull"], ["--seq_len", "64", "--help"]])
def test_every_help_spelling_prints_help_and_flags_given_show_currently(argv, capsys):
    code = cli.exit_code(argv)
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("farm-llama-runner: ")
    if "--seq_len" in argv:
        assert "    -seq_len (Total number of tokens to generate (prompt + output).)\n" \
               "      type: int32 default: 128 currently: 64\n" in out
