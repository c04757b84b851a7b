"""The runners farm-llama-runner can be: its own surface (``host``: qnn_llama_runner v1.0.1's flags plus
``--token_ids_path`` and ``--seed``) or upstream qnn_llama_runner v1.4.1's, byte for byte.

A release is what a runner shows of itself: its flags (gflags' DEFINE_* lines, defaults and help texts
verbatim), the file gflags says defines them, the chat templates and end markers it knows, its
PyTorchObserver line, when its token generator prints a newline, and how it answers a flag it does not
define. The run itself (the model, the updaters) is the same code whichever release is shown.

A runner is v1.4.1 when its argv starts with ``--ptefarm_upstream=v1.4.1`` (``EMULATE``): the script a
bundle stages as its qnn_llama_runner puts it there (farm/selftest/upstream.py ``V1_4_1_RUNNER``), and
the marker travels with the argv to a runner zygote's fork. Nothing else selects it: a phone's runner is
told apart by its ``--help`` (farm.execute.runprofile.detect_dialect), and so is this one.

Sources, at tags of pytorch/executorch: QLR = examples/qualcomm/oss_scripts/llama/qnn_llama_runner.cpp,
RUN = examples/qualcomm/oss_scripts/llama/runner/runner.cpp,
TOK = examples/qualcomm/oss_scripts/llama/runner/token_generator.cpp, STATS = extension/llm/runner/stats.h.
"""

from __future__ import annotations

from typing import NamedTuple

from farm.runner.gflags_help import FlagInfo

EMULATE = "--ptefarm_upstream="  # argv[0] of a runner shown as an upstream release: EMULATE + name
HOST_FLAGS_FILE = "farm/runner/cli.py"  # where gflags would say farm-llama-runner's flags are defined
# As a build names it in --help: its source tree's absolute path (upstream's docker build is in /executorch).
QLR_FILE = "/executorch/examples/qualcomm/oss_scripts/llama/qnn_llama_runner.cpp"
GFLAGS_SRC = "external/gflags/src/"


class Flag(NamedTuple):
    """One flag: its gflags description (type, default, help) and how argparse reads it."""

    name: str
    type: str  # gflags' type name: string, int32, double, bool
    default: object
    help: str
    shown_default: object = None  # what --help prints as the default, when it differs
    file: str | None = None  # where gflags says it is defined, when not the runner's own file

    def info(self, filename: str) -> FlagInfo:
        shown = self.default if self.shown_default is None else self.shown_default
        return FlagInfo(self.name, self.type, shown, self.help, self.file or filename)


# The DEFINE_* lines both releases share (QLR v1.0.1:26-84, v1.4.1:26-94). --prompt is read as upstream
# reads it (collect_prompts): its gflags default is never run, by upstream or by us.
_DECODER = Flag("decoder_model_version", "string", "llama2", "The decoder model to execute.")
_MODEL = Flag("model_path", "string", "kv_llama_qnn.pte", "Model serialized in flatbuffer format.")
_OUTPUT = Flag("output_path", "string", "outputs.txt", "Executorch inference data output path.")
_SPEED = Flag("performance_output_path", "string", "inference_speed.txt",
              "Records inference speed. For CI purpose.")
_LOGITS = Flag("dump_logits_path", "string", "",
               "If path is provided, program will dump all logits generated. This option is for analysis "
               "purpose. It is not recommended for general usage as it will cause token rate drop and "
               "increase in memory usage.")
_TOKENIZER = Flag("tokenizer_path", "string", "tokenizer.bin", "Tokenizer stuff.")
_PROMPT = Flag("prompt", "string", None,
               "User prompts for Llama. When multiple prompts are entered, a multi-turn conversation will "
               "be initiated. Note that this feature is currently for testing purposes only.",
               shown_default="The answer to the ultimate question is")
_TOKENIZED = Flag("tokenized_prompt", "string", "",
                  "This is an alternative of passing prompts. Users could provide this in a raw file, with "
                  "tokens saved in uint64 format.")
_SYSTEM = Flag("system_prompt", "string", "",
               "Tells the model what kind of assistant it should be. For example, You are a helpful AI "
               "assistant for travel tips and recommendations. Default is None")
_TEMPERATURE = Flag("temperature", "double", 0.0,
                    "Temperature; Default is 0.0f. 0 = greedy argmax sampling (deterministic). Lower "
                    "temperature = more deterministic")
_SEQ_LEN = Flag("seq_len", "int32", 128, "Total number of tokens to generate (prompt + output).")
_EVAL_MODE = Flag("eval_mode", "int32", 1,
                  "0: TokenGenerator(kv) / 1: HybridMode (prefill+kv) / 2: Lookahead Decoding")
_ITERS = Flag("num_iters", "int32", 1, "total num of iterations to run.")
_LOOKAHEAD = (
    Flag("ngram", "int32", 0,
         "[Lookahead Decoding] Represents the size of the n-grams used in the lookahead process."),
    Flag("window", "int32", 0,
         "[Lookahead Decoding] Determines how many future tokens the algorithm attempts to predict "
         "in each step."),
    Flag("gcap", "int32", 0,
         "[Lookahead Decoding] Represents the maximum number of speculations or candidate n-grams "
         "that the algorithm considers in each step for verification. It balances the trade-off "
         "between computation efficiency and exploring more possibilities."),
)
# gflags' own (gflags_reporting.cc), which farm-llama-runner lists beside its flags.
_HELP = (Flag("help", "bool", False, "show help on all flags [tip: all flags can have two dashes]"),
         Flag("helpfull", "bool", False, "show help on all flags -- same as -help"))

# v1.0.1 (QLR:26-84), then the flags of ours.
HOST_FLAGS: tuple[Flag, ...] = (
    _DECODER, _MODEL, _OUTPUT, _SPEED, _LOGITS, _TOKENIZER, _PROMPT, _TOKENIZED, _SYSTEM, _TEMPERATURE,
    _SEQ_LEN, _EVAL_MODE,
    Flag("kv_updater", "string", "SmartMask", "How to update kv cache. Choose between SmartMask and ShiftPointer"),
    _ITERS, *_LOOKAHEAD,
    # Ours (ptefarm):
    Flag("token_ids_path", "string", "",
         "(ptefarm) Writes the prompt and generated token ids of the last iteration as JSON."),
    Flag("seed", "int32", 0, "(ptefarm) Sampling seed for --temperature > 0 and lookahead guesses."),
    *_HELP,
)

# What gflags v2.2.2 itself defines (gflags.cc, gflags_completions.cc, gflags_reporting.cc), which a
# phone's runner lists after its own and takes like any flag (only -help and -helpfull print here).
_GFLAGS_OWN = tuple(Flag(n, t, d, h, file=GFLAGS_SRC + f) for f, n, t, d, h in (
    ("gflags.cc", "flagfile", "string", "", "load flags from file"),
    ("gflags.cc", "fromenv", "string", "", "set flags from the environment [use 'export FLAGS_flag1=value']"),
    ("gflags.cc", "tryfromenv", "string", "", "set flags from the environment if present"),
    ("gflags.cc", "undefok", "string", "",
     "comma-separated list of flag names that it is okay to specify on the command line even if the "
     "program does not define a flag with that name.  IMPORTANT: flags in this list that have "
     "arguments MUST use the flag=value format"),
    ("gflags_completions.cc", "tab_completion_columns", "int32", 80,
     "Number of columns to use in output for tab completion"),
    ("gflags_completions.cc", "tab_completion_word", "string", "",
     "If non-empty, HandleCommandLineCompletions() will hijack the process and attempt to do "
     "bash-style command line flag completion on this value."),
    ("gflags_reporting.cc", "help", "bool", False, "show help on all flags [tip: all flags can have two dashes]"),
    ("gflags_reporting.cc", "helpfull", "bool", False, "show help on all flags -- same as -help"),
    ("gflags_reporting.cc", "helpmatch", "string", "",
     "show help on modules whose name contains the specified substr"),
    ("gflags_reporting.cc", "helpon", "string", "", "show help on the modules named by this flag value"),
    ("gflags_reporting.cc", "helppackage", "bool", False, "show help on all modules in the main package"),
    ("gflags_reporting.cc", "helpshort", "bool", False, "show help on only the main module for this program"),
    ("gflags_reporting.cc", "helpxml", "bool", False, "produce an xml version of help"),
    ("gflags_reporting.cc", "version", "bool", False, "show version and build info and exit"),
))

# v1.4.1 (QLR:26-94): --attention_sink_rope_path is new, --shared_buffer replaces --kv_updater.
V1_4_1_FLAGS: tuple[Flag, ...] = (
    _DECODER, _MODEL,
    Flag("attention_sink_rope_path", "string", "",
         "[Attention Sink] The Attention Sink Rope Model is serialized using the flatbuffer format. If "
         "specified, seq_len can exceed the context length defined in the model."),
    _OUTPUT, _SPEED, _LOGITS, _TOKENIZER, _PROMPT, _TOKENIZED, _SYSTEM, _TEMPERATURE, _SEQ_LEN, _EVAL_MODE,
    Flag("shared_buffer", "bool", False,
         "Specifies to use shared buffers for zero-copy use case between the application and "
         "device/co-processor associated with the backend."),
    _ITERS, *_LOOKAHEAD, *_GFLAGS_OWN,
)


# qnn_multimodal_runner v1.4.1 (QMR = examples/qualcomm/oss_scripts/llama/qnn_multimodal_runner.cpp:43-125),
# in its order; help texts verbatim (several differ from qnn_llama_runner's).
QMR_FILE = "/executorch/examples/qualcomm/oss_scripts/llama/qnn_multimodal_runner.cpp"
MULTIMODAL_V1_4_1_FLAGS: tuple[Flag, ...] = (
    Flag("tok_embedding_path", "string", "tok_embedding.pte",
         "Path to tok_embedding model serialized in flatbuffer format."),
    Flag("encoder_path", "string", "encoder.pte", "Path to vision encoder model serialized in flatbuffer format."),
    Flag("decoder_path", "string", "decoder.pte", "Path to decoder model serialized in flatbuffer format."),
    Flag("tokenizer_path", "string", "tokenizer.bin", "Tokenizer path."),
    _OUTPUT, _SPEED,
    Flag("dump_logits_path", "string", "", "If path is provided, program will dump all logits generated."),
    Flag("decoder_model_version", "string", "llama3", "The decoder model version."),
    Flag("prompt", "string", None, "Text prompt for the multimodal model.", shown_default="Describe this image:"),
    _TOKENIZED,
    Flag("audio_path", "string", "",
         "Path to input audio file. For Audio-Language models, please specify audio path."),
    Flag("image_path", "string", "",
         "Path to input image file. For Vision-Language models, please specify image path."),
    Flag("system_prompt", "string", "", "System prompt for the model."),
    _TEMPERATURE, _SEQ_LEN, _EVAL_MODE,
    Flag("shared_buffer", "bool", False,
         "Specifies to use shared buffers for zero-copy use case between the application and "
         "device/co-processor associated with the backend."),
    Flag("ngram", "int32", 0, "[Lookahead Decoding] Size of n-grams used in lookahead process."),
    Flag("window", "int32", 0, "[Lookahead Decoding] Number of future tokens to predict in each step."),
    Flag("gcap", "int32", 0, "[Lookahead Decoding] Maximum number of speculations or candidate n-grams."),
    Flag("num_iters", "int32", 1, "Total number of iterations to run."),
    *_GFLAGS_OWN,
)


class Release(NamedTuple):
    """What one runner shows of itself. A NamedTuple: the zygote client imports this module, and
    dataclasses costs its start-up ~0.1 s."""

    name: str
    flags: tuple[Flag, ...]
    flags_file: str  # the file gflags names above the flags in --help
    usage: str  # --help's first line, after the program name
    templates: str  # farm.model.template.TEMPLATES' key: the chat templates and end markers it knows
    # PyTorchObserver's JSON starts with prefill_token_per_sec and decode_token_per_sec (STATS v1.4.1:100-117)
    observer_rates: bool
    # the token generator prints a newline when seq_len ends the generation too, not only at EOS
    # (TOK v1.4.1:351-353): with kv and hybrid there is one newline per prompt, always
    newline_at_limit: bool
    # a flag it does not define is gflags' "ERROR: unknown command line flag" and exit 1, not ours
    gflags_errors: bool
    updaters: tuple[str, ...]  # the KV updaters it can run: the first is what it runs by default
    kv_method: str  # the method eval_mode 0 runs: v1.0.1's `forward`, v1.4.1's `kv_forward` (RUN v1.4.1:165-169)
    # it runs programs of 1.4.1's I/O layout only (a 4-D mask, one cache per layer: RUN v1.4.1:234-249
    # read them so); the host release runs both (farm/runner/io_v14.py tells them apart)
    v14_layout_only: bool
    program: str = "qnn_llama_runner"  # the binary's name (--help's first line); qnn_multimodal_runner: its run

    @property
    def multimodal(self) -> bool:
        return self.program == "qnn_multimodal_runner"

    def flag_infos(self) -> list[FlagInfo]:
        return [f.info(self.flags_file) for f in self.flags]

    def has(self, flag: str) -> bool:
        return any(f.name == flag for f in self.flags)


HOST = Release("host", HOST_FLAGS, HOST_FLAGS_FILE,
               "a host stand-in for qnn_llama_runner v1.0.1 (ExecuTorch): the same flags, outputs.txt, "
               "inference_speed.txt and stdout", "v1.0.1", observer_rates=False, newline_at_limit=False,
               gflags_errors=False, updaters=("SmartMask", "ShiftPointer"), kv_method="forward",
               v14_layout_only=False)
# gflags' usage line when the program never calls SetUsageMessage, as qnn_llama_runner does not.
V1_4_1 = Release("v1.4.1", V1_4_1_FLAGS, QLR_FILE, "Warning: SetUsageMessage() never called", "v1.4.1",
                 observer_rates=True, newline_at_limit=True, gflags_errors=True, updaters=("SmartMask",),
                 kv_method="kv_forward", v14_layout_only=True)
MULTIMODAL_V1_4_1 = V1_4_1._replace(name="multimodal-v1.4.1", flags=MULTIMODAL_V1_4_1_FLAGS, flags_file=QMR_FILE,
                                    program="qnn_multimodal_runner")
RELEASES: dict[str, Release] = {r.name: r for r in (HOST, V1_4_1, MULTIMODAL_V1_4_1)}


def split_release(argv: list[str]) -> tuple[Release, list[str]]:
    """The release ``argv`` asks to be shown (its first argument, ``EMULATE``NAME) and the rest of it."""
    if argv and argv[0].startswith(EMULATE):
        name = argv[0][len(EMULATE):]
        if name not in RELEASES:
            from farm.errors import UsageError

            raise UsageError(f"{EMULATE}{name}: not a release this runner can be "
                             f"({', '.join(n for n in RELEASES if n != HOST.name)})")
        return RELEASES[name], argv[1:]
    return HOST, argv
