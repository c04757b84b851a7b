"""--eval_mode 2: lookahead decoding writes hybrid mode's greedy tokens, in fewer model steps.

Upstream (ExecuTorch v1.0.1, examples/qualcomm/oss_scripts/llama/): LHD = runner/lhd_token_generator.cpp,
RUN = runner/runner.cpp, llama.py (how a lookahead model is exported: kv_forward of ar_len
next_power_of_two((window + gcap) * (ngram - 1)), prefill_forward as in hybrid mode).

The reference bundle's hybrid .pte decodes with ar_len 1, which leaves no room for guesses; as upstream
exports a separate lookahead_llama_qnn.pte, the reference bundle has a lookahead program of the same
weights with a kv_forward of ar_len 16 (window 4, gcap 4, ngram 3: its manifest's lookahead mode).
"""

from __future__ import annotations

import json

import pytest
import torch

from farm.bundle import manifest as bundle_mod
from farm.runner import main as runner_main
from farm.runner.engine import LlamaRunner
from farm.runner.io_manager import UPDATERS
from farm.runner.lookahead import LookaheadConfig, next_power_of_two
from tests.support.runner import TEXT, paths

WINDOW, GCAP, NGRAM = 4, 4, 3
CFG = LookaheadConfig(NGRAM, WINDOW, GCAP)


@pytest.fixture(scope="session")
def lookahead_pte(tiny_bundle):
    """The reference bundle's lookahead program: upstream's lookahead export of the same weights
    (the hybrid .pte's constant methods and prefill_forward, a kv_forward of ar_len
    next_power_of_two(rows)), exported with this module's window, gcap and ngram."""
    mode = bundle_mod.load(tiny_bundle).modes["lookahead"]
    assert (mode.ngram, mode.window, mode.gcap) == (NGRAM, WINDOW, GCAP)
    assert mode.decode_ar_len == next_power_of_two(CFG.rows) == 16
    return paths(tiny_bundle, "lookahead")[0]


def _hybrid(tiny_bundle, updater: str) -> LlamaRunner:
    pte, tok = paths(tiny_bundle, "hybrid")
    return LlamaRunner(pte, tok, 1, UPDATERS[updater], "llama2")


def _lookahead(tiny_bundle, pte: str, updater: str, cfg: LookaheadConfig = CFG, seed: int = 0):
    return LlamaRunner(pte, paths(tiny_bundle, "hybrid")[1], 2, UPDATERS[updater], "llama2",
                       lookahead=cfg, seed=seed)


@pytest.mark.parametrize("updater", ["SmartMask", "ShiftPointer"])
@pytest.mark.parametrize("prompt,seq_len", [("Once upon a time", 100), (TEXT[:150], 110)])
def test_lookahead_writes_hybrids_greedy_tokens_in_fewer_steps(tiny_bundle, lookahead_pte, updater,
                                                               prompt, seq_len):
    expected = _hybrid(tiny_bundle, updater).complete(prompt, seq_len)
    runner = _lookahead(tiny_bundle, lookahead_pte, updater)
    got = runner.complete(prompt, seq_len)
    assert got.prompt_ids == expected.prompt_ids
    # LHD:228: the loop checks seq_len per step, a step may write up to ngram tokens: it can overrun.
    n = len(expected.generated_ids)
    assert got.generated_ids[:n] == expected.generated_ids
    assert n <= len(got.generated_ids) <= n + NGRAM - 1
    assert got.stats.generated_tokens == len(got.generated_ids) - 1  # LHD:395: pos - start_pos
    # Guesses were accepted (that path is exercised): fewer model steps than tokens decoded.
    assert runner.lookahead.accepted > 0
    assert runner.lookahead.steps < got.stats.generated_tokens


def test_guesses_change_the_steps_never_the_tokens(tiny_bundle, lookahead_pte):
    # LHD:77 seeds the guesses with random prompt tokens; at temperature 0 only the speed depends on it.
    runs = [_lookahead(tiny_bundle, lookahead_pte, "SmartMask", seed=s) for s in (0, 1, 2)]
    outs = [r.complete("Once upon a time there was", 90).generated_ids for r in runs]
    assert outs[0] == outs[1] == outs[2]


def test_a_second_turn_continues_after_a_lookahead_turn(tiny_bundle, lookahead_pte):
    """RUN:447: cur_pos carries over; the next prompt's prefill runs on the prefill's causal mask
    again (here prefill and lookahead methods have the same ar_len, so nothing else resets it)."""
    gen = torch.Generator()
    hybrid = _hybrid(tiny_bundle, "SmartMask")
    first_h = hybrid.generate("Once upon a time", 40, 0.0, gen)
    second_h = hybrid.generate(" there was", 70, 0.0, gen)
    runner = _lookahead(tiny_bundle, lookahead_pte, "SmartMask")
    first = runner.generate("Once upon a time", 40, 0.0, gen)
    assert first.generated_ids[: len(first_h.generated_ids)] == first_h.generated_ids
    if len(first.generated_ids) == len(first_h.generated_ids):  # no overrun: same position
        second = runner.generate(" there was", 70, 0.0, gen)
        assert second.generated_ids[: len(second_h.generated_ids)] == second_h.generated_ids
    else:
        pytest.fail("choose a seq_len at which the first turn ends exactly at seq_len - 1")


def test_the_cli_runs_eval_mode_2_with_upstreams_flags(tiny_bundle, lookahead_pte, tmp_path,
                                                        monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    tok = paths(tiny_bundle, "hybrid")[1]
    argv = ["--model_path", lookahead_pte, "--tokenizer_path", tok, "--eval_mode", "2", "--prompt",
            "Once upon a time", "--seq_len", "80", "--window", WINDOW, "--gcap", GCAP, "--ngram",
            NGRAM, "--token_ids_path", "ids.json"]
    with pytest.raises(SystemExit) as exc:
        runner_main.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert exc.value.code == 0, err
    ids = json.loads((tmp_path / "ids.json").read_text())["generated_ids"]
    expected = _hybrid(tiny_bundle, "SmartMask").complete("Once upon a time", 80).generated_ids
    assert ids[: len(expected)] == expected
    assert out.startswith("PyTorchObserver {")


@pytest.mark.parametrize("flags,needle", [
    ((0, 0, 0), "--ngram: lookahead decoding (--eval_mode 2) needs --ngram of at least 2, got 0"),
    ((3, 0, 4), "--window: lookahead decoding (--eval_mode 2) needs --window of at least 1"),
    ((3, 4, 0), "--gcap: lookahead decoding (--eval_mode 2) needs --gcap of at least 1"),
    ((3, 8, 4), "has ar_len 16, lookahead with --window 8 --gcap 4 --ngram 3 needs (window + gcap) * "
                "(ngram - 1) = 24 rows; export it with ar_len 32"),
])
def test_lookahead_flags_that_cannot_run_are_one_clear_line(tiny_bundle, lookahead_pte, flags, needle,
                                                            tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ngram, window, gcap = flags
    argv = ["--model_path", lookahead_pte, "--tokenizer_path", paths(tiny_bundle, "hybrid")[1],
            "--eval_mode", "2", "--prompt", "Once", "--ngram", ngram, "--window", window, "--gcap", gcap]
    with pytest.raises(SystemExit) as exc:
        runner_main.main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and needle in err, err
    assert list(tmp_path.iterdir()) == []


def test_the_attention_map_is_upstreams():
    # LHD:40-64 for window 2, ngram 3, gcap 2: level 0 a chain, level 1 under its column, each
    # verification n-gram under row 0 and then its own previous row.
    assert LookaheadConfig(3, 2, 2).attention_map() == [-1, 0, 0, 1, 0, 4, 0, 6]
    block = LookaheadConfig(3, 2, 2).block(8, -1.0)
    sees = (block == 0).int().tolist()
    assert sees[3] == [1, 1, 0, 1, 0, 0, 0, 0]  # level 1, column 1: rows 0, 1 (its column) and itself
    assert sees[5] == [1, 0, 0, 0, 1, 1, 0, 0]  # n-gram 0, second token: row 0, its first, itself
    assert next_power_of_two(24) == 32 and next_power_of_two(16) == 16 and next_power_of_two(0) == 1
