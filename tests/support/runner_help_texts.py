"""What runners print for ``--help``, one text per release, in the shape of the real output.

qnn_llama_runner parses its flags with gflags: ``--help`` prints every flag of every file linked in,
grouped "Flags from FILE:" (files and flags sorted by name, two extra blank lines where the
directory changes), one ``    -name (help text) type: T default: V`` entry per flag (wrapped at
80 columns, continuation lines indented by six), to stdout, then exits 1. Upstream's flags per release
(examples/qualcomm/oss_scripts/llama/qnn_llama_runner.cpp) are in the ExecuTorch fact sheet:

- v0.6.0: ``--kv_updater`` declared as ``DEFINE_string(kv_updater, "How to update kv cache...",
  "SmartMask")``: gflags takes the second argument as the default, so the help text reads "SmartMask"
  and the default is the sentence;
- v1.0.1: ``--kv_updater`` (SmartMask | ShiftPointer), default SmartMask;
- v1.1.0: ``--shared_buffer`` (bool), no ``--kv_updater``: ShiftPointer is gone;
- farm-llama-runner: the same layout (farm/runner/gflags_help.py), v1.0.1's flags plus ``--token_ids_path``
  and ``--seed``.
"""

from __future__ import annotations

# After the runner's own file, gflags' files: another directory, so two more blank lines first.
_GFLAGS_OWN = """


  Flags from external/gflags/src/gflags.cc:
    -flagfile (load flags from file) type: string default: ""
    -fromenv (set flags from the environment [use 'export FLAGS_flag1=value'])
      type: string default: ""
    -tryfromenv (set flags from the environment if present) type: string
      default: ""
    -undefok (comma-separated list of flag names that it is okay to specify on
      the command line even if the program does not define a flag with that
      name.  IMPORTANT: flags in this list that have arguments MUST use the
      flag=value format) type: string default: ""

  Flags from external/gflags/src/gflags_completions.cc:
    -tab_completion_columns (Number of columns to use in output for tab
      completion) type: int32 default: 80
    -tab_completion_word (If non-empty, HandleCommandLineCompletions() will
      hijack the process and attempt to do bash-style command line flag
      completion on this value.) type: string default: ""

  Flags from external/gflags/src/gflags_reporting.cc:
    -help (show help on all flags [tip: all flags can have two dashes])
      type: bool default: false currently: true
    -helpfull (show help on all flags -- same as -help) type: bool
      default: false
    -helpmatch (show help on modules whose name contains the specified substr)
      type: string default: ""
    -helpon (show help on the modules named by this flag value) type: string
      default: ""
    -helppackage (show help on all modules in the main package) type: bool
      default: false
    -helpshort (show help on only the main module for this program) type: bool
      default: false
    -helpxml (produce an xml version of help) type: bool default: false
    -version (show version and build info and exit) type: bool default: false
"""

_HEAD = "qnn_llama_runner: Warning: SetUsageMessage() never called\n"
_FILE = "\n  Flags from /executorch/examples/qualcomm/oss_scripts/llama/qnn_llama_runner.cpp:\n"

# Entries shared by the releases, in pieces: gflags sorts a file's flags by name, so each release
# puts its own flags between them.
_COMMON = """\
    -model_path (Model serialized in flatbuffer format.) type: string
      default: "kv_llama_qnn.pte"
    -num_iters (total num of iterations to run.) type: int32 default: 1
    -output_path (Executorch inference data output path.) type: string
      default: "outputs.txt"
    -performance_output_path (Records inference speed. For CI purpose.)
      type: string default: "inference_speed.txt"
    -prompt (User prompts for Llama. When multiple prompts are entered, a
      multi-turn conversation will be initiated. Note that this feature is
      currently for testing purposes only.) type: string
      default: "The answer to the ultimate question is"
    -seq_len (Total number of tokens to generate (prompt + output).)
      type: int32 default: 128
"""

_COMMON_B = """\
    -system_prompt (Tells the model what kind of assistant it should be. For
      example, You are a helpful AI assistant for travel tips and
      recommendations. Default is None) type: string default: ""
    -temperature (Temperature; Default is 0.0f. 0 = greedy argmax sampling
      (deterministic). Lower temperature = more deterministic) type: double
      default: 0
"""

_TOKENIZER_PATH = """\
    -tokenizer_path (Tokenizer stuff.) type: string default: "tokenizer.bin"
"""

# v0.6.0: help text and default swapped on --kv_updater.
QNN_V0_6_0 = _HEAD + _FILE + """\
    -eval_mode (0: PromptProcessor(prefill) / 1: TokenGenerator(kv) / 2:
      HybridMode (prefill+kv)) type: int32 default: 1
    -kv_updater (SmartMask) type: string
      default: "How to update kv cache. Choose between SmartMask and ShiftPointer"
    -logits_offset (Logits offset) type: int32 default: 0
    -logits_scale (Logits scale) type: double default: 0
""" + _COMMON + _COMMON_B + _TOKENIZER_PATH + _GFLAGS_OWN

QNN_V1_0_1 = _HEAD + _FILE + """\
    -decoder_model_version (The decoder model to execute.) type: string
      default: "llama2"
    -dump_logits_path (If path is provided, program will dump all logits
      generated. This option is for analysis purpose. It is not recommended for
      general usage as it will cause token rate drop and increase in memory
      usage.) type: string default: ""
    -eval_mode (0: TokenGenerator(kv) / 1: HybridMode (prefill+kv) / 2:
      Lookahead Decoding) type: int32 default: 1
    -gcap ([Lookahead Decoding] Represents the maximum number of speculations
      or candidate n-grams that the algorithm considers in each step for
      verification. It balances the trade-off between computation efficiency
      and exploring more possibilities.) type: int32 default: 0
    -kv_updater (How to update kv cache. Choose between SmartMask and
      ShiftPointer) type: string default: "SmartMask"
    -model_path (Model serialized in flatbuffer format.) type: string
      default: "kv_llama_qnn.pte"
    -ngram ([Lookahead Decoding] Represents the size of the n-grams used in the
      lookahead process.) type: int32 default: 0
    -num_iters (total num of iterations to run.) type: int32 default: 1
    -output_path (Executorch inference data output path.) type: string
      default: "outputs.txt"
    -performance_output_path (Records inference speed. For CI purpose.)
      type: string default: "inference_speed.txt"
    -prompt (User prompts for Llama. When multiple prompts are entered, a
      multi-turn conversation will be initiated. Note that this feature is
      currently for testing purposes only.) type: string
      default: "The answer to the ultimate question is"
    -seq_len (Total number of tokens to generate (prompt + output).)
      type: int32 default: 128
    -system_prompt (Tells the model what kind of assistant it should be. For
      example, You are a helpful AI assistant for travel tips and
      recommendations. Default is None) type: string default: ""
    -temperature (Temperature; Default is 0.0f. 0 = greedy argmax sampling
      (deterministic). Lower temperature = more deterministic) type: double
      default: 0
    -tokenized_prompt (This is an alternative of passing prompts. Users could
      provide this in a raw file, with tokens saved in uint64 format.)
      type: string default: ""
    -tokenizer_path (Tokenizer stuff.) type: string default: "tokenizer.bin"
    -window ([Lookahead Decoding] Determines how many future tokens the
      algorithm attempts to predict in each step.) type: int32 default: 0
""" + _GFLAGS_OWN

QNN_V1_1_0 = _HEAD + _FILE + """\
    -decoder_model_version (The decoder model to execute.) type: string
      default: "llama2"
    -eval_mode (0: TokenGenerator(kv) / 1: HybridMode (prefill+kv) / 2:
      Lookahead Decoding) type: int32 default: 1
""" + _COMMON + """\
    -shared_buffer (Specifies to use shared buffers for zero-copy use case
      between the application and device/co-processor associated with the
      backend.) type: bool default: false
""" + _COMMON_B + """\
    -tokenized_prompt (This is an alternative of passing prompts. Users could
      provide this in a raw file, with tokens saved in uint64 format.)
      type: string default: ""
""" + _TOKENIZER_PATH + _GFLAGS_OWN

# farm-llama-runner, in gflags' layout (farm/runner/gflags_help.py): v1.0.1's flags, its own two, -help.
HOST_RUNNER = """\
farm-llama-runner: a host stand-in for qnn_llama_runner v1.0.1 (ExecuTorch): the same flags, outputs.txt, inference_speed.txt and stdout

  Flags from farm/runner/cli.py:
    -decoder_model_version (The decoder model to execute.) type: string
      default: "llama2"
    -dump_logits_path (If path is provided, program will dump all logits
      generated. This option is for analysis purpose. It is not recommended for
      general usage as it will cause token rate drop and increase in memory
      usage.) type: string default: ""
    -eval_mode (0: TokenGenerator(kv) / 1: HybridMode (prefill+kv) / 2:
      Lookahead Decoding) type: int32 default: 1
    -gcap ([Lookahead Decoding] Represents the maximum number of speculations
      or candidate n-grams that the algorithm considers in each step for
      verification. It balances the trade-off between computation efficiency
      and exploring more possibilities.) type: int32 default: 0
    -help (show help on all flags [tip: all flags can have two dashes])
      type: bool default: false currently: true
    -helpfull (show help on all flags -- same as -help) type: bool
      default: false
    -kv_updater (How to update kv cache. Choose between SmartMask and
      ShiftPointer) type: string default: "SmartMask"
    -model_path (Model serialized in flatbuffer format.) type: string
      default: "kv_llama_qnn.pte"
    -ngram ([Lookahead Decoding] Represents the size of the n-grams used in the
      lookahead process.) type: int32 default: 0
    -num_iters (total num of iterations to run.) type: int32 default: 1
    -output_path (Executorch inference data output path.) type: string
      default: "outputs.txt"
    -performance_output_path (Records inference speed. For CI purpose.)
      type: string default: "inference_speed.txt"
    -prompt (User prompts for Llama. When multiple prompts are entered, a
      multi-turn conversation will be initiated. Note that this feature is
      currently for testing purposes only.) type: string
      default: "The answer to the ultimate question is"
    -seed ((ptefarm) Sampling seed for --temperature > 0 and lookahead
      guesses.) type: int32 default: 0
    -seq_len (Total number of tokens to generate (prompt + output).)
      type: int32 default: 128
    -system_prompt (Tells the model what kind of assistant it should be. For
      example, You are a helpful AI assistant for travel tips and
      recommendations. Default is None) type: string default: ""
    -temperature (Temperature; Default is 0.0f. 0 = greedy argmax sampling
      (deterministic). Lower temperature = more deterministic) type: double
      default: 0
    -token_ids_path ((ptefarm) Writes the prompt and generated token ids of the
      last iteration as JSON.) type: string default: ""
    -tokenized_prompt (This is an alternative of passing prompts. Users could
      provide this in a raw file, with tokens saved in uint64 format.)
      type: string default: ""
    -tokenizer_path (Tokenizer stuff.) type: string default: "tokenizer.bin"
    -window ([Lookahead Decoding] Determines how many future tokens the
      algorithm attempts to predict in each step.) type: int32 default: 0
"""

# The --help of the release each QNN dialect stands for (what the fake runners answer).
BY_DIALECT = {"qnn-v1.0": QNN_V1_0_1, "qnn-v1.4": QNN_V1_1_0}
