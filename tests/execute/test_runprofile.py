import shlex
from pathlib import Path

import pytest

from farm.bundle.manifest import Bundle, BundleFile, Mode
from farm.errors import UsageError
from farm.execute.runprofile import RunRequest, build_command, kill_command, runner_argv

HOSTILE = ["it's \"quoted\"", "$(touch /tmp/pwned) `id`; rm -rf / && echo $HOME",
           "line one\nline two\r\n\ttab", "héllo wörld — 日本語 🦙", "--prompt", "", "\\\\ \\n '"]


def _bundle(dialect: str) -> Bundle:
    f = [BundleFile(n, Path("/x") / n, 1, "0" * 64, role=r)
         for n, r in (("kv.pte", "pte"), ("h.pte", "pte"), ("tok.model", "tokenizer"),
                      ("qnn_llama_runner", "runner"))]
    return Bundle(name="b", runner_dialect=dialect, tokenizer="tok.model", files=f,
                  modes={"kv": Mode("kv.pte", 0, 1), "hybrid": Mode("h.pte", 1, 32)},
                  runner=None if dialect == "host" else "qnn_llama_runner",
                  manifest_path=Path("/x/manifest.json"))


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_qnn_v10_command_line():
    argv, outputs = runner_argv(_bundle("qnn-v1.0"), RunRequest(
        prompts=["hi", "again"], mode="hybrid", updater="ShiftPointer", system_prompt="sys",
        seq_len=256, temperature=0.0, num_iters=3), "runs/r1")
    assert argv[0] == "./qnn_llama_runner"
    assert _flag(argv, "--model_path") == "h.pte"
    assert _flag(argv, "--tokenizer_path") == "tok.model"
    assert _flag(argv, "--eval_mode") == "1"
    assert _flag(argv, "--kv_updater") == "ShiftPointer"
    assert _flag(argv, "--seq_len") == "256"
    assert _flag(argv, "--num_iters") == "3"
    assert _flag(argv, "--system_prompt") == "sys"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--prompt"] == ["hi", "again"]
    assert _flag(argv, "--output_path") == "runs/r1/outputs.txt"
    assert _flag(argv, "--performance_output_path") == "runs/r1/inference_speed.txt"
    assert "--shared_buffer" not in argv and "--token_ids_path" not in argv
    assert set(outputs) == {"outputs", "speed"}


def test_shared_buffer_dialect_takes_smartmask_only():
    argv, _ = runner_argv(_bundle("qnn-v1.4"), RunRequest(prompts=["x"]), "runs/r")
    assert "--shared_buffer" in argv and "--kv_updater" not in argv
    with pytest.raises(UsageError, match="qnn-v1.4.*ShiftPointer"):
        runner_argv(_bundle("qnn-v1.4"), RunRequest(prompts=["x"], updater="ShiftPointer"),
                    "runs/r")


def test_host_dialect_adds_token_ids_and_seed():
    argv, outputs = runner_argv(_bundle("host"), RunRequest(prompts=["x"], seed=7, temperature=0.8),
                                "runs/r")
    assert argv[0] == "farm-llama-runner"
    assert _flag(argv, "--token_ids_path") == "runs/r/token_ids.json"
    assert _flag(argv, "--seed") == "7"
    assert _flag(argv, "--kv_updater") == "SmartMask"
    assert outputs["token_ids"] == "token_ids.json"


def test_seed_with_sampling_is_refused_by_qnn_runners():
    with pytest.raises(UsageError, match="qnn-v1.0.*--seed"):
        runner_argv(_bundle("qnn-v1.0"), RunRequest(prompts=["x"], seed=1, temperature=0.7), "r")
    argv, _ = runner_argv(_bundle("qnn-v1.0"), RunRequest(prompts=["x"], seed=1), "r")  # greedy
    assert "--seed" not in argv


@pytest.mark.parametrize("bad, message", [
    ({"prompts": []}, "at least one --prompt"),
    ({"prompts": ["a\0b"]}, "NUL"),
    ({"prompts": ["x"], "updater": "Ring"}, "--updater"),
    ({"prompts": ["x"], "mode": "lookahead"}, "no mode 'lookahead'"),
    ({"prompts": ["x"], "seq_len": 0}, "--seq-len"),
    ({"prompts": ["x"], "num_iters": 0}, "--num-iters"),
    ({"prompts": ["x"], "temperature": -1}, "--temperature"),
])
def test_bad_requests_are_usage_errors(bad, message):
    with pytest.raises(UsageError, match=message):
        runner_argv(_bundle("qnn-v1.0"), RunRequest(**bad), "runs/r")


def test_shell_command_quotes_every_argument():
    request = RunRequest(prompts=HOSTILE, system_prompt="a'b")
    cmd = build_command(_bundle("qnn-v1.0"), request, "/data/local/tmp/ptefarm/my bundle", "r1")
    assert cmd.shell.startswith("cd '/data/local/tmp/ptefarm/my bundle' && "
                                "export LD_LIBRARY_PATH=. ADSP_LIBRARY_PATH=. && ")
    # What sh would pass to exec is exactly the argv.
    exec_part = cmd.shell.split(" && exec ", 1)[1]
    assert shlex.split(exec_part) == cmd.argv
    assert cmd.out_dir == "/data/local/tmp/ptefarm/my bundle/runs/r1"
    assert "echo $$ > runs/r1/runner.pid" in cmd.shell
    assert "kill -9" in kill_command(cmd) and "r1" in kill_command(cmd)


def test_oversized_command_is_refused():
    with pytest.raises(UsageError, match="byte limit"):
        build_command(_bundle("host"), RunRequest(prompts=["x" * 70_000]), "/w", "r")


def test_the_output_folder_name_must_be_a_plain_name():
    with pytest.raises(UsageError, match="output folder name"):
        build_command(_bundle("host"), RunRequest(prompts=["x"]), "/w", "../escape")
