"""ci/pr-gate.sh against the main branch's bundle (PTEFARM_BASELINE_BUNDLE) on a farm's phones, here a
simulated SM8650 of a running virtual farm that the config names: the pull request's bundle (a
rebuild: same programs, other bytes) is A/B'd against the baseline on the same phone. A 5 % slowdown
knob on the pull request's program fails the gate with the ratio and its interval; without the knob
the same two bundles pass. Every figure is marked simulated."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from farm.bundle.manifest import load
from farm.exitcodes import ExitCode
from farm.runner.timing import Slowdown
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.virtual.simphone import reset_state
from tests.support.bundle import rebuilt_copy
from tests.support.plugin import junit_cases
from tests.support.pool import REPO

CI_VARS = ("GITHUB_STEP_SUMMARY", "PTEFARM_GATE_SOCS", "PTEFARM_GATE_CONFIG", "PTEFARM_PURPOSE",
           "PTEFARM_BASELINE", "PTEFARM_BUNDLE", "PTEFARM_BASELINE_BUNDLE", "PTEFARM_CONFIG")


@pytest.fixture(scope="module")
def phone(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate-ab")
    with VirtualFarm(home=root / "farm") as vf:
        # A fixed serial: the simulated phone's draws follow it (and the run's index on the device)
        [record] = vf.up([VirtualDeviceSpec(soc="SM8650", timing="phone", serial_hint="V8650GATE1")])
        config = root / "farm.toml"
        config.write_text(f'[farm]\nhome = "{root / "home"}"\n\n[pool]\nurl = "sqlite:///{root / "pool.db"}"\n\n'
                          f'[[adb_servers]]\nhost = "{vf.adb_server.host}"\nport = {vf.adb_server.port}\n')
        yield vf, record, config


def _gate(config, out, bundle, baseline):
    env = {k: v for k, v in os.environ.items() if k not in CI_VARS}
    env.update(PTEFARM_CONFIG=str(config), PTEFARM_BASELINE_BUNDLE=str(baseline))
    return subprocess.run(["bash", str(REPO / "ci" / "pr-gate.sh"), "--out", str(out), "--bundle", str(bundle),
                           "SM8650", "--", "-k", "against_baseline", "--farm-ab-seed", "5"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.statistical
def test_a_five_percent_slowdown_of_the_pr_bundle_fails_the_gate(phone, tiny_bundle, tmp_path):
    """Deterministic: a fixed serial, the phone at rest and a fixed --farm-ab-seed make every figure
    the same on every run (ci/flake-check.sh repeats it to show it)."""
    vf, record, config = phone
    reset_state(vf.device(record.serial).root)
    pr = rebuilt_copy(tiny_bundle, tmp_path / "pr", "reference-tiny-pr")
    hybrid = next(f for f in load(pr).files if f.name == "hybrid_llama_xnnpack.pte")
    assert hybrid.sha256 != next(f.sha256 for f in load(tiny_bundle).files if f.name == hybrid.name)
    vf.set_slowdowns(record.serial, (Slowdown(1 / 0.95, model_sha256=hybrid.sha256),))
    try:
        slow = _gate(config, tmp_path / "slow", pr, tiny_bundle)
    finally:
        vf.set_slowdowns(record.serial, ())
    assert slow.returncode == ExitCode.TEST_FAILURE, slow.stdout[-3000:] + slow.stderr[-3000:]
    assert "--ab-baseline" in slow.stderr
    [case] = junit_cases(tmp_path / "slow")
    assert case.name.startswith("test_against_baseline_bundle[SM8650-hybrid-128-SmartMask]")
    assert case.outcome == "failed", case.message
    assert "throughput regression against the baseline bundle 'reference-tiny'" in case.message
    assert "SIMULATED" in case.message  # never read as a phone's measurement
    ratio = float(case.properties["ab.ratio"])
    assert ratio == pytest.approx(0.95, abs=0.015)
    low, high = map(float, re.match(r"\[(\S+), (\S+)\]", case.properties["ab.interval"]).groups())
    assert low <= ratio <= high < 1
    assert case.properties["ab.verdict"] == "slower"
    assert "::error" in slow.stdout  # annotated as a failure of the pull request

    same = _gate(config, tmp_path / "same", pr, tiny_bundle)
    assert same.returncode == ExitCode.OK, same.stdout[-3000:] + same.stderr[-3000:]
    [case] = junit_cases(tmp_path / "same")
    assert case.outcome == "passed" and case.properties["ab.verdict"] in ("same", "undecided")
    runs = case.properties["tok_s_runs.candidate"].split()
    assert len(runs) == int(case.properties["ab.blocks"]) >= 6


def test_without_a_baseline_bundle_the_ab_test_is_skipped(phone, tiny_bundle, tmp_path):
    _, _, config = phone
    env = {k: v for k, v in os.environ.items() if k not in CI_VARS}
    env.update(PTEFARM_CONFIG=str(config))
    proc = subprocess.run(["bash", str(REPO / "ci" / "pr-gate.sh"), "--out", str(tmp_path / "r"), "--bundle",
                           str(tiny_bundle), "SM8650", "--", "-k", "against_baseline"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == ExitCode.OK, proc.stdout[-3000:] + proc.stderr[-3000:]
    [case] = junit_cases(tmp_path / "r")
    assert case.outcome == "skipped" and "no --farm-ab-baseline" in case.message
