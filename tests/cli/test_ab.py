"""`farm ab` on simulated phones: SmartMask against ShiftPointer on the same devices with an interval, a
5 % slowdown knob caught (and exit 4 as a gate), every run's conditions kept, every figure marked
simulated, and bad input refused before any device is leased.

The phones have fixed serials, each comparison starts them at rest (``reset_state``) and ``--seed``
fixes the blocks' order, so every figure here is the same on every run: the verdicts asserted must
hold, not merely usually hold (marked ``statistical``: ci/flake-check.sh repeats them to show it)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from farm.cli.main import main
from farm.runner.timing import Slowdown
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.virtual.simphone import reset_state


@pytest.fixture(scope="module")
def phones(tmp_path_factory):
    root = tmp_path_factory.mktemp("ab")
    with VirtualFarm(home=root / "farm") as vf:
        records = vf.up([VirtualDeviceSpec(soc="SM8650", timing="phone", serial_hint=f"V8650AB0{i}")
                         for i in (1, 2)])
        config = root / "farm.toml"
        config.write_text(f'[farm]\nhome = "{root / "home"}"\n\n'
                          f'[[adb_servers]]\nhost = "{vf.adb_server.host}"\nport = {vf.adb_server.port}\n')
        yield vf, records, config


@pytest.fixture
def at_rest(phones):
    """Both phones at rest with no run behind them: a comparison's figures do not depend on which
    tests ran before it."""
    vf, records, _ = phones
    for r in records:
        reset_state(vf.device(r.serial).root)
    return phones


def _ab(config, *args: str):
    return CliRunner().invoke(main, ["ab", *args, "--soc", "SM8650", "--config", str(config), "--json",
                                     "--seed", "3"])


@pytest.mark.statistical
def test_smartmask_against_shiftpointer_on_the_same_phones(at_rest, tiny_bundle):
    _, records, config = at_rest
    ran = _ab(config, str(tiny_bundle), "--devices", "2", "--a-updater", "ShiftPointer",
              "--b-updater", "SmartMask")
    assert ran.exit_code == 0, ran.output
    out = json.loads(ran.output)
    result = out["result"]
    # the data file's SM8650 figures at a 128-token cache: 62 / 57 tok/s decode, prefill counted in
    assert result["verdict"] == "faster"
    assert result["low"] < result["ratio"] < result["high"] and 1.04 < result["ratio"] < 1.14
    assert sorted(result["per_device"]) == sorted(r.serial for r in records)
    assert out["simulated"] is True and out["timing"] == "simulated"
    assert len(out["samples"]) == 2 * result["blocks"]  # two runs per block
    for s in out["samples"]:
        assert s["battery_level"] is not None and s["temp_before_c"] is not None
        assert s["temp_after_c"] is not None and s["thermal_status"] is not None


@pytest.fixture(scope="module")
def kv4096_bundle():
    """tiny with a KV cache of 4096: the regime of upstream's SM8650 claim (a run's cost follows the
    static cache's length, so 256 generated tokens measure it)."""
    from dataclasses import replace

    from farm.bundle.export import export_config, resolve_config

    return export_config(replace(resolve_config("tiny"), name="tiny-kv4096", max_seq_len=4096))


@pytest.mark.statistical
def test_smartmask_against_shiftpointer_at_kv_4096_on_simulated_sm8650s(at_rest, kv4096_bundle):
    """The A/B machinery on a known effect: the simulated SM8650's timing data gives SmartMask 47 and
    ShiftPointer 40 tok/s at kv 4096 (upstream's published figures, written into the model), so the
    A/B must find that ratio of ~1.17 with an interval around it. Circular by design: it checks the
    comparison, not upstream's claim, which only a phone can test."""
    _, _, config = at_rest
    ran = _ab(config, str(kv4096_bundle), "--devices", "2", "--a-updater", "ShiftPointer",
              "--b-updater", "SmartMask", "--seq-len", "256")
    assert ran.exit_code == 0, ran.output
    out = json.loads(ran.output)
    result = out["result"]
    assert result["verdict"] == "faster" and out["simulated"] is True
    assert 1.12 < result["ratio"] < 1.22, result  # 47 / 40 = 1.175, prefill and noise aside
    # The interval's top at the first look (4 blocks on each of 2 devices, at 98.75 %) is about the
    # largest block's ratio, and a simulated phone's heavy tail (a background task in one ShiftPointer
    # run, 4 % of runs) lifts it: simulated with the same model 2,000 times, it was >= 1.3 in 7 % of
    # comparisons (the bound this test had, which CI once hit at 1.307), >= 1.66 in 0.1 %, never 1.8.
    assert 1.0 < result["low"] <= result["ratio"] <= result["high"] < 1.8, result
    assert "hybrid/ShiftPointer seq_len 256" in out["a"] and "hybrid/SmartMask" in out["b"]
    assert set(out["governor_pinning"].values()) == {"not pinned: the shell is not root (uid 2000)"}


@pytest.mark.statistical
def test_a_five_percent_slowdown_is_caught_and_fails_the_gate(at_rest, tiny_bundle):
    vf, records, config = at_rest
    for r in records:
        vf.set_slowdowns(r.serial, (Slowdown(1 / 0.95, flag="seed", value="7"),))
    try:
        ran = _ab(config, str(tiny_bundle), "--devices", "2", "--b-arg=--seed=7", "--fail-if-slower")
        same = _ab(config, str(tiny_bundle), "--devices", "2", "--b-arg=--seed=8", "--fail-if-slower")
    finally:
        for r in records:
            vf.set_slowdowns(r.serial, ())
    assert ran.exit_code == 4, ran.output
    result = json.loads(ran.output)["result"]
    # 0.95 within what a run of the tiny model resolves: its ~45 ms of decoding are timed in whole ms,
    # so a 5 % slowdown reads as 2 or 3 ms (4.4-6.7 %) a run
    assert result["verdict"] == "slower" and result["ratio"] == pytest.approx(0.95, abs=0.03)
    assert result["low"] < 1.0 and result["high"] < 1.0
    # the same runs without the knob: identical variants are not called different
    assert same.exit_code == 0, same.output
    assert json.loads(same.output)["result"]["verdict"] in ("same", "undecided")


def test_identical_variants_and_a_bad_design_are_refused_before_any_device(phones, tiny_bundle):
    _, _, config = phones
    same = _ab(config, str(tiny_bundle))
    assert same.exit_code == 2 and "A and B are the same" in same.output
    bad = _ab(config, str(tiny_bundle), "--b-updater", "ShiftPointer", "--min-effect", "0")
    assert bad.exit_code == 2 and "minimum effect" in bad.output


def test_the_cli_design_defaults_are_the_library_s():
    from farm.results.ab import ABConfig

    defaults = {p.name: p.default for p in main.commands["ab"].params}
    d = ABConfig()
    assert (defaults["min_blocks"], defaults["max_blocks"], defaults["look_every"]) == \
        (d.min_blocks, d.max_blocks, d.look_every)
    assert (defaults["alpha"], defaults["min_effect"] / 100) == (d.alpha, d.min_effect)
