"""--dump_logits_path: upstream's layout (prefill rows, then decode rows), the host model's float32.

Upstream (ExecuTorch v1.0.1, examples/qualcomm/oss_scripts/llama/):
  QLR = qnn_llama_runner.cpp, RUN = runner/runner.cpp, PP = runner/prompt_processor.cpp,
  TOK = runner/token_generator.cpp, DU = decoder_utils.py (how llama.py reads the dump back).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from farm.model.llama import eager_logits
from farm.runner import main as runner_main
from farm.runner.logits import (
    DEVICE_DTYPE,
    HOST_DTYPE,
    LogitsDumpError,
    diff_logits,
    dtype_for,
    read_logits_dump,
)
from tests.support.runner import make_runner, paths

# XNNPACK's float32 kernels against torch's eager model (special tokens sit near -1e4: relative too).
TOLERANCE = {"atol": 2e-3, "rtol": 1e-5}


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        runner_main.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def teacher_forced(weights, fed: list[int]) -> np.ndarray:
    return eager_logits(weights, fed).numpy()


def test_a_kv_run_dumps_one_row_per_prompt_token_then_per_decode_step(tiny_bundle, tiny_weights,
                                                                      in_tmp, capsys):
    pte, tok = paths(tiny_bundle, "kv")
    code, out, err = run_cli(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0",
                              "--prompt", "Once upon a time", "--seq_len", "40",
                              "--dump_logits_path", "all_logit.raw", "--token_ids_path", "ids.json"],
                             capsys)
    assert code == 0, err
    stats = json.loads(out.splitlines()[-1].split(" ", 1)[1])
    ids = json.loads((in_tmp / "ids.json").read_text())
    # PP:313-317 (kv mode: ar_len 1, one row per prompt token), TOK:284-288 (one per decode step).
    n_rows = stats["prompt_tokens"] + stats["generated_tokens"]
    rows = read_logits_dump(in_tmp / "all_logit.raw", n_rows=n_rows)
    vocab = make_runner(tiny_bundle, "kv", "SmartMask").vocab_size
    assert rows.shape == (n_rows, vocab) and rows.dtype == HOST_DTYPE
    assert (in_tmp / "all_logit.raw").stat().st_size == n_rows * vocab * 4  # raw float32, no header
    # Each row is the logits at one fed position: the prompt, then every generated token but the last.
    fed = ids["prompt_ids"] + ids["generated_ids"][:-1]
    assert len(fed) == n_rows
    np.testing.assert_allclose(rows, teacher_forced(tiny_weights, fed), **TOLERANCE)
    # The last prompt row gave the prefill's token, each decode row the next one.
    assert rows[len(ids["prompt_ids"]) - 1:].argmax(axis=1).tolist() == ids["generated_ids"]


def test_turns_dump_every_prefill_row_before_every_decode_row(tiny_bundle, tiny_weights):
    """RUN:456-460 writes prompt_all_logits_ then token_all_logits_, both kept over the runner's
    life: after two turns the file is turn 1's and turn 2's prompt rows, then both turns' decode rows."""
    runner = make_runner(tiny_bundle, "kv", "SmartMask")
    runner.prefill_logits, runner.decode_logits = [], []
    gen = torch.Generator()
    first = runner.generate("Once upon a time", 24, 0.0, gen)
    second = runner.generate(" there was", 60, 0.0, gen)
    fed = (first.prompt_ids + first.generated_ids[:-1] + second.prompt_ids
           + second.generated_ids[:-1])
    expected = teacher_forced(tiny_weights, fed)
    p1, g1 = len(first.prompt_ids), first.stats.generated_tokens
    p2 = len(second.prompt_ids)
    order = np.concatenate([expected[:p1], expected[p1 + g1 : p1 + g1 + p2],  # prompt rows
                            expected[p1 : p1 + g1], expected[p1 + g1 + p2 :]])  # decode rows
    dump = np.frombuffer(runner.logits_dump(), dtype=HOST_DTYPE).reshape(-1, runner.vocab_size)
    np.testing.assert_allclose(dump, order, **TOLERANCE)


def test_a_prefill_chunk_dumps_all_its_rows_padding_included(tiny_bundle):
    """PP:313-317 appends ar_len * vocab values per prefill step, a last partial chunk's padding too
    (the host runner keeps that layout in every mode, though upstream dumps in kv mode only)."""
    runner = make_runner(tiny_bundle, "hybrid", "SmartMask")
    runner.prefill_logits, runner.decode_logits = [], []
    gen = runner.generate("Once upon a time, there was a little girl", 30, 0.0, torch.Generator())
    chunks = -(-len(gen.prompt_ids) // runner.prefill_ar)
    assert [r.shape for r in runner.prefill_logits] == [(runner.prefill_ar, runner.vocab_size)] * chunks
    assert len(runner.decode_logits) == gen.stats.generated_tokens
    assert len(runner.logits_dump()) == 4 * runner.vocab_size * (chunks * runner.prefill_ar
                                                                 + gen.stats.generated_tokens)


@pytest.mark.parametrize("path", ["all_logit.raw", ""])
def test_dumping_needs_eval_mode_0_as_upstream(path, tiny_bundle, in_tmp, capsys):
    # QLR:247-251: the flag given at all (even empty) with another eval_mode is an abort.
    pte, tok = paths(tiny_bundle, "hybrid")
    code, _, err = run_cli(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "1",
                            "--prompt", "Once", "--dump_logits_path", path], capsys)
    assert code == 2
    assert "--dump_logits_path: Only TokenGenerator(kv) mode is supported to dump all logits" in err
    assert list(in_tmp.iterdir()) == []


def test_without_the_flag_nothing_is_kept(tiny_bundle):
    runner = make_runner(tiny_bundle, "kv", "SmartMask")
    runner.complete("Once", 20)
    assert runner.prefill_logits is None and runner.decode_logits is None and runner.logits_dump() == b""


# -- the reader the farm imports -------------------------------------------------------------------

def test_a_device_dump_is_uint16_dequantized_as_llama_py_does(tmp_path):
    # DU:224-232: np.fromfile(dtype=uint16).reshape(1, -1, vocab); (q - zero_point) * scale.
    q = np.array([[0, 100, 65535], [32768, 1, 2]], dtype="<u2")
    (tmp_path / "d.raw").write_bytes(q.tobytes())
    assert dtype_for(host_runner=False) == DEVICE_DTYPE and dtype_for(host_runner=True) == HOST_DTYPE
    raw = read_logits_dump(tmp_path / "d.raw", vocab_size=3, dtype=DEVICE_DTYPE)
    assert raw.dtype == np.uint16 and raw.tolist() == q.tolist()
    deq = read_logits_dump(tmp_path / "d.raw", vocab_size=3, dtype=DEVICE_DTYPE, scale=0.5,
                           zero_point=32768)
    assert deq.dtype == np.float32
    assert deq.tolist() == [[-16384.0, -16334.0, 16383.5], [0.0, -16383.5, -16383.0]]


def test_the_vocabulary_follows_from_the_row_count(tmp_path):
    (tmp_path / "h.raw").write_bytes(np.arange(12, dtype="<f4").tobytes())
    assert read_logits_dump(tmp_path / "h.raw", n_rows=3).shape == (3, 4)
    assert read_logits_dump(tmp_path / "h.raw", vocab_size=6).shape == (2, 6)


@pytest.mark.parametrize("content,kwargs,message", [
    (b"\0" * 10, {"vocab_size": 2}, "10 bytes is not a whole number of float32 values"),
    (b"\0" * 24, {"vocab_size": 4}, "6 float32 values are not whole rows of a 4-token vocabulary"),
    (b"\0" * 24, {"n_rows": 4}, "6 float32 values do not make 4 rows"),
    (b"\0" * 24, {"vocab_size": 3, "n_rows": 3}, "2 rows of 3 logits, expected 3"),
    (b"\0" * 24, {}, "give vocab_size or a positive n_rows"),
    (None, {"vocab_size": 3}, "cannot read the logits dump"),
])
def test_a_dump_that_does_not_fit_is_a_clear_error_naming_the_file(tmp_path, content, kwargs, message):
    path = tmp_path / "all_logit.raw"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(LogitsDumpError) as caught:
        read_logits_dump(path, **kwargs)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)


def test_a_diff_reports_the_largest_difference_and_the_first_row_that_differs():
    a = np.zeros((4, 3), dtype=np.float32)
    same = diff_logits(a, a.copy())
    assert same.identical and same.max_abs_diff == 0.0 and same.rows_compared == 4
    b = a.copy()
    b[2, 1], b[3, 0] = 0.25, -0.5
    d = diff_logits(a, b)
    assert (d.first_differing_row, d.max_abs_diff, d.identical) == (2, 0.5, False)
    assert diff_logits(a, b, tolerance=0.3).first_differing_row == 3
    assert diff_logits(a, b, tolerance=0.5).first_differing_row is None
    shorter = diff_logits(a, a[:3])  # equal over the common rows, yet a row is missing
    assert shorter.first_differing_row is None and shorter.rows == (4, 3) and not shorter.identical
    nan = a.copy()
    nan[1, 2] = np.nan
    assert diff_logits(a, nan).first_differing_row == 1 and diff_logits(nan, nan.copy()).identical
    with pytest.raises(LogitsDumpError, match="cannot be compared"):
        diff_logits(a, np.zeros((4, 5), dtype=np.float32))


def test_a_run_names_the_dtype_of_its_runners_dump():
    """farm.execute.run names the dump's dtype without numpy; it must be this module's."""
    from farm.execute.run import logits_dtype
    from farm.vocab import Dialect

    assert np.dtype(logits_dtype(Dialect.HOST)) == dtype_for(host_runner=True)
    for dialect in (Dialect.QNN_V1_0, Dialect.QNN_V1_4):
        assert np.dtype(logits_dtype(dialect)) == dtype_for(host_runner=False)
