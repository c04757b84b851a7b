"""farm-llama-runner: upstream's flags and output files; bad input is one clear line and exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from farm.runner import main as runner_main


def run_cli(argv, cwd, capsys):
    with pytest.raises(SystemExit) as exc:
        runner_main.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_gflags_spellings(kv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pte, tok = kv
    code, _, err = run_cli([f"--model_path={pte}", "-tokenizer_path", tok, "--seq_len=60",
                            "--temperature=0", "-eval_mode", "0", "--prompt", "Hi"], tmp_path, capsys)
    assert code == 0, err
    assert (tmp_path / "outputs.txt").stat().st_size > 0


def test_hostile_prompt_reaches_the_runner_unchanged(kv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pte, tok = kv
    prompt = "say \"hi\" $(rm -rf /) `id`; ünïcödé\nnext line"
    code, _, err = run_cli(["--model_path", pte, "--tokenizer_path", tok, "--prompt", prompt,
                            "--seq_len", "90", "--temperature", "0", "--eval_mode", "0"], tmp_path, capsys)
    assert code == 0, err
    assert prompt.encode() in (tmp_path / "outputs.txt").read_bytes()


def _corrupt_pte(tmp_path):
    p = tmp_path / "corrupt.pte"
    p.write_bytes(b"\x00not a flatbuffer" * 100)
    return p


def _bad_tokenizer(tmp_path):
    p = tmp_path / "tokenizer.model"
    p.write_text("this is not base64 !!!\n")
    return p


BAD_INPUTS = [
    # (name, argv builder, text the one-line error must contain)
    ("missing pte", lambda kv, hy, t: ["--model_path", t / "nope.pte", "--tokenizer_path", kv[1]],
     "--model_path"),
    ("corrupt pte", lambda kv, hy, t: ["--model_path", _corrupt_pte(t), "--tokenizer_path", kv[1]],
     "corrupt.pte"),
    ("method missing", lambda kv, hy, t: ["--model_path", kv[0], "--tokenizer_path", kv[1],
                                          "--eval_mode", "1"], "'prefill_forward'"),
    ("unknown updater", lambda kv, hy, t: ["--model_path", kv[0], "--tokenizer_path", kv[1],
                                           "--kv_updater", "SmartPointer"], "--kv_updater"),
    ("prompt longer than context", lambda kv, hy, t: ["--model_path", hy[0], "--tokenizer_path",
                                                      hy[1], "--eval_mode", "1", "--seq_len", "128",
                                                      "--prompt", "word " * 200],
     "sequence length exceeded"),
    ("unreadable tokenizer", lambda kv, hy, t: ["--model_path", hy[0], "--tokenizer_path",
                                                _bad_tokenizer(t)], "--tokenizer_path"),
    ("missing tokenizer", lambda kv, hy, t: ["--model_path", hy[0], "--tokenizer_path",
                                             t / "none.model"], "none.model"),
    ("unknown eval mode", lambda kv, hy, t: ["--model_path", kv[0], "--tokenizer_path", kv[1],
                                             "--eval_mode", "3"], "--eval_mode"),
    ("lookahead on a kv model", lambda kv, hy, t: ["--model_path", kv[0], "--tokenizer_path", kv[1],
                                                   "--eval_mode", "2"], "'prefill_forward'"),
    ("not a number", lambda kv, hy, t: ["--model_path", kv[0], "--seq_len", "many"], "--seq_len"),
    ("unknown flag", lambda kv, hy, t: ["--model_path", kv[0], "--kv_updator", "SmartMask"],
     "--kv_updator"),
]


@pytest.mark.parametrize("name,argv,needle", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_clear_line(name, argv, needle, kv, hybrid, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(argv(kv, hybrid, tmp_path), tmp_path, capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("farm-llama-runner: error:")]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "outputs.txt").exists()  # nothing half-written


def test_console_script_exit_code_and_no_traceback(tmp_path):
    """The installed command, as a device would run it: exit 2 and no traceback on bad input."""
    proc = subprocess.run([sys.executable, "-m", "farm.runner.main", "--model_path",
                           str(tmp_path / "missing.pte")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "farm-llama-runner: error: --model_path:" in proc.stderr
