"""`farm devices`, `farm deploy` and `farm run` as a new user types them, against virtual devices."""

from __future__ import annotations

import json
import socket

import pytest
from click.testing import CliRunner

from farm.cli.main import main
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from tests.support.devices import bundles_per_dialect


@pytest.fixture(scope="module")
def cli_farm(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    manifests = bundles_per_dialect(root, "cli")
    with VirtualFarm(home=root / "farm") as vf:
        records = vf.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8550", platform_only=True)])
        config = root / "farm.toml"
        config.write_text(f'[farm]\nhome = "{root / "home"}"\n\n'
                          f'[[adb_servers]]\nhost = "{vf.adb_server.host}"\nport = {vf.adb_server.port}\n')
        yield vf, records, config, manifests


def _farm(*args: str, **env):
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "250", **env})


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_devices_table_and_json(cli_farm):
    vf, records, config, _ = cli_farm
    table = _farm("devices", "--config", str(config))
    assert table.exit_code == 0, table.output
    for r in records:
        assert r.serial in table.output
    assert "SM8650" in table.output and "v75" in table.output and "kalama" not in table.output
    listed = json.loads(_farm("devices", "--config", str(config), "--json").output)
    assert {d["serial"]: (d["soc"], d["htp_arch"]) for d in listed["devices"]} == {
        records[0].serial: ("SM8650", "v75"), records[1].serial: ("SM8550", "v73")}
    assert listed["servers"] == [{"server": str(vf.adb_server), "error": None}]


def test_devices_lists_an_unreachable_server_without_hiding_the_others(cli_farm, tmp_path):
    vf, records, _, _ = cli_farm
    port = _dead_port()
    config = tmp_path / "farm.toml"
    config.write_text(f'[[adb_servers]]\nport = {vf.adb_server.port}\n\n[[adb_servers]]\nport = {port}\n')
    result = _farm("devices", "--config", str(config), "--json")
    assert result.exit_code == 3
    listed = json.loads(result.stdout)
    assert len(listed["devices"]) == len(records)
    assert f"127.0.0.1:{port} unreachable" in listed["servers"][1]["error"]


def test_deploy_then_run(cli_farm, tmp_path):
    _, records, config, manifests = cli_farm
    serial = records[0].serial
    first = _farm("deploy", str(manifests["qnn-v1.0"]), "--serial", serial, "--config", str(config))
    assert first.exit_code == 0, first.output
    assert f"{serial}: pushed 7 files" in first.output
    again = _farm("deploy", str(manifests["qnn-v1.0"]), "--serial", serial, "--config", str(config),
                  "--json")
    assert json.loads(again.output)["bytes_pushed"] == 0

    ran = _farm("run", str(manifests["qnn-v1.0"]), "--serial", serial, "--config", str(config),
                "--prompt", "a 'quoted' $(prompt)", "--prompt", "turn two", "--updater", "ShiftPointer",
                "--mode", "hybrid", "--json", "--out", str(tmp_path / "out"))
    assert ran.exit_code == 0, ran.output
    result = json.loads(ran.output)
    assert json.loads(result["text"])["prompts"] == ["a 'quoted' $(prompt)", "turn two"]
    assert result["tokens_per_s"] == 50.0 and result["serial"] == serial  # ShiftPointer's figure
    assert (result["timing"], result["figures"]) == ("host-cpu", "host CPU (virtual device)")
    assert (tmp_path / "out" / "outputs.txt").exists()
    text = _farm("run", str(manifests["qnn-v1.0"]), "--serial", serial, "--config", str(config),
                 "--prompt", "hi", "--no-deploy")
    assert text.exit_code == 0 and "prefill tok/s 100.0 (host CPU (virtual device));" in text.output


def test_a_simulated_phones_figures_say_so_in_farm_run(tmp_path):
    """`farm run` on a virtual device with phone timing: its text and its JSON say SIMULATED beside
    the figures, as the reports do: a simulated figure never reads as a phone's measurement."""
    manifest = bundles_per_dialect(tmp_path, "sim")["qnn-v1.0"]
    with VirtualFarm(home=tmp_path / "farm") as vf:
        [dev] = vf.up([VirtualDeviceSpec(soc="SM8650", timing="phone")])
        config = tmp_path / "farm.toml"
        config.write_text(f'[farm]\nhome = "{tmp_path / "home"}"\n\n'
                          f'[[adb_servers]]\nhost = "{vf.adb_server.host}"\nport = {vf.adb_server.port}\n')
        ran = _farm("run", str(manifest), "--serial", dev.serial, "--config", str(config), "--prompt", "hi",
                    "--json")
        assert ran.exit_code == 0, ran.output
        assert json.loads(ran.output)["timing"] == "simulated"
        text = _farm("run", str(manifest), "--serial", dev.serial, "--config", str(config), "--prompt", "hi")
    assert text.exit_code == 0, text.output
    assert "(SIMULATED (phone model, not measured))" in text.output, text.output


def test_run_errors_are_one_line(cli_farm):
    _, records, config, manifests = cli_farm
    serial = records[1].serial
    failed = _farm("run", str(manifests["qnn-v1.0"]), "--serial", serial, "--config", str(config),
                   "--prompt", "FAIL")
    assert failed.exit_code == 1
    assert "exited 7: fake runner: cannot load model [RunnerFailed]" in failed.output

    wrong = _farm("run", str(manifests["qnn-v1.4"]), "--serial", serial, "--config",
                  str(config), "--prompt", "x", "--updater", "ShiftPointer")
    assert wrong.exit_code == 2
    assert "'qnn-v1.4' supports only the SmartMask updater" in wrong.output

    unknown = _farm("run", str(manifests["qnn-v1.0"]), "--serial", "NOPE", "--config", str(config),
                    "--prompt", "x")
    assert unknown.exit_code == 2 and "device NOPE not found" in unknown.output
