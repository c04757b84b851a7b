"""A virtual device started with a phone's timing (``--timing phone``): it says so in its properties,
its runner reports the model's figures (not the host's), a slowdown knob slows the runs it names, and
the heat its runs make shows where a phone shows heat. The phone has a fixed serial and each test starts
it at rest (``reset_state``), so its figures are the same every time: the tests that judge them are
deterministic (marked ``statistical``: ci/flake-check.sh runs them again and again to show it)."""

from __future__ import annotations

import json
import statistics
import time

import adbutils
import pytest
from click.testing import CliRunner

from farm.cli.main import main
from farm.runner.timing import Slowdown, default_seed
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.virtual.identity import load_identity
from farm.virtual.simphone import HEAT_REL, SPEC_REL, reset_state, set_seed


@pytest.fixture(scope="module")
def sim_farm(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    with VirtualFarm(home=root / "farm") as vf:
        records = vf.up([VirtualDeviceSpec(soc="SM8650", timing="phone", serial_hint="V8650SIM01"),
                         VirtualDeviceSpec(soc="SM8650", serial_hint="V8650HOST1")])
        config = root / "farm.toml"
        config.write_text(f'[farm]\nhome = "{root / "home"}"\n\n'
                          f'[[adb_servers]]\nhost = "{vf.adb_server.host}"\nport = {vf.adb_server.port}\n')
        yield vf, records, config


def _shell(vf, serial: str, command: str) -> str:
    return adbutils.AdbClient(vf.adb_server.host, vf.adb_server.port).device(serial).shell(command)


def _rate(config, manifest, serial: str, updater: str) -> float:
    ran = CliRunner().invoke(main, ["run", str(manifest), "--serial", serial, "--config", str(config),
                                    "--prompt", "hello", "--updater", updater, "--mode", "hybrid", "--json"])
    assert ran.exit_code == 0, ran.output
    return json.loads(ran.output)["tokens_per_s"]


@pytest.fixture
def at_rest(sim_farm):
    """The simulated phone at rest with no run behind it: its next run is its run 0."""
    vf, (sim, _), _ = sim_farm
    reset_state(vf.device(sim.serial).root)
    return sim_farm


@pytest.mark.statistical
def test_a_simulated_phone_says_so_and_reports_its_socs_figures(at_rest, tiny_bundle):
    vf, (sim, host), config = at_rest
    assert vf.device(sim.serial).root.joinpath(SPEC_REL).exists()
    assert not host.root.joinpath(SPEC_REL).exists()
    assert _shell(vf, sim.serial, "getprop ro.ptefarm.timing").strip() == "simulated"
    assert _shell(vf, host.serial, "getprop ro.ptefarm.timing").strip() == ""
    rates = [_rate(config, tiny_bundle, sim.serial, "SmartMask") for _ in range(3)]
    # SM8650 at the tiny model's 128-token cache: 62 tok/s decode in the data file, prefill counted
    # in, this unit's own factor (+-10 %) and run noise
    assert 50 < statistics.median(rates) < 68, rates
    # its draws are its serial's and its runs' own: at rest again, the same runs report the same
    reset_state(vf.device(sim.serial).root)
    assert [_rate(config, tiny_bundle, sim.serial, "SmartMask") for _ in range(3)] == rates
    # another seed in its spec: other draws, from the next run
    root = vf.device(sim.serial).root
    set_seed(root, load_identity(root).props, 12345, confined=vf.device(sim.serial).confined)
    reset_state(root)
    try:
        assert [_rate(config, tiny_bundle, sim.serial, "SmartMask") for _ in range(3)] != rates
    finally:
        set_seed(root, load_identity(root).props, default_seed(sim.serial), confined=vf.device(sim.serial).confined)


@pytest.mark.statistical
def test_a_slowdown_knob_slows_the_runs_it_names_from_the_next_run(at_rest, tiny_bundle):
    vf, (sim, _), config = at_rest
    before = statistics.median(_rate(config, tiny_bundle, sim.serial, "ShiftPointer") for _ in range(3))
    vf.set_slowdowns(sim.serial, (Slowdown(2.0, flag="kv_updater", value="ShiftPointer"),))
    try:
        after = statistics.median(_rate(config, tiny_bundle, sim.serial, "ShiftPointer") for _ in range(3))
        other = _rate(config, tiny_bundle, sim.serial, "SmartMask")
    finally:
        vf.set_slowdowns(sim.serial, ())
    assert 1.7 < before / after < 2.3, (before, after)
    assert other > after * 1.5  # the knob named ShiftPointer only


def test_runs_heat_the_phone_where_a_phone_shows_heat(sim_farm, tiny_bundle):
    vf, (sim, _), config = sim_farm
    root = vf.device(sim.serial).root
    # far enough past throttling that the idle gap before the next run leaves it there
    (root / HEAT_REL).write_text(json.dumps({"temp_c": 64.0}))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        zones = {z["type"]: z["temp_c"] for z in json.loads((root / "phone.json").read_text())["thermal"]}
        if zones["nsphvx-0"] > 58:
            break
        time.sleep(0.2)
    assert zones["nsphvx-0"] > 58 and zones["skin-therm"] > 40
    out = _shell(vf, sim.serial, "dumpsys thermalservice")
    assert "Thermal Status: 0" not in out, out  # the skin zone's status follows the heat
    hot = _rate(config, tiny_bundle, sim.serial, "SmartMask")
    assert hot < 50, hot  # a throttled HTP: SM8650's 62 tok/s / 1.35
    (root / HEAT_REL).unlink()


def test_a_bad_timing_is_refused_before_anything_starts(tmp_path):
    from farm.errors import UsageError

    with pytest.raises(UsageError, match="timing must be one of host, phone"):
        VirtualDeviceSpec(timing="fast")
    with pytest.raises(UsageError, match="no simulated phone timing for SM8475"):
        VirtualDeviceSpec(soc="SM8475", timing="phone")
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (dev,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        with pytest.raises(UsageError, match="runs on host timing"):
            vf.set_slowdowns(dev.serial, (Slowdown(1.1, flag="kv_updater", value="SmartMask"),))
