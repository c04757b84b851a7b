"""Farm homes side by side on one host: each has its own adb server, sees only its own devices, and
bringing one down never disturbs another's; a shared (configured) server stays up while it serves
another home's devices."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from farm.config import ADB_PORT_FILE
from farm.device.adb_server import AdbServer
from farm.virtual import VirtualFarm
from farm.virtual.manager import free_port


def _farm(env: dict[str, str | None], *args: str) -> str:
    from farm.cli.main import main

    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _devices(env: dict[str, str | None]) -> dict[str, str]:
    """serial -> state, as `farm devices --json` of that home lists them."""
    listed = json.loads(_farm(env, "devices", "--json"))
    assert [s["error"] for s in listed["servers"]] == [None]
    return {d["serial"]: d["state"] for d in listed["devices"]}


def _up(env: dict[str, str | None]) -> str:
    _farm(env, "virtual", "up", "--soc", "SM8650")
    [serial] = json.loads(_farm(env, "virtual", "ls", "--json"))["devices"]
    return serial["serial"]


@pytest.fixture
def homes(tmp_path, monkeypatch) -> Iterator[tuple[dict, dict, Path, Path]]:
    """Two farm homes with the built-in defaults (no config file), as two CI jobs on one host."""
    monkeypatch.chdir(tmp_path)  # no ./farm.toml
    a, b = tmp_path / "a", tmp_path / "b"
    env = {"PTEFARM_CONFIG": None}
    yield {**env, "PTEFARM_HOME": str(a)}, {**env, "PTEFARM_HOME": str(b)}, a, b
    for home in (a, b):  # whatever a failed test left up
        if (home / "virtual" / "state.json").exists():
            VirtualFarm(home=home, tie_to_owner=False).down()


def test_two_farm_homes_see_only_their_own_devices_and_stop_independently(homes):
    env_a, env_b, home_a, home_b = homes
    serial_a, serial_b = _up(env_a), _up(env_b)
    assert _devices(env_a) == {serial_a: "device"}
    assert _devices(env_b) == {serial_b: "device"}
    port_a = int((home_a / ADB_PORT_FILE).read_text())
    port_b = int((home_b / ADB_PORT_FILE).read_text())

    _farm(env_a, "virtual", "down")
    assert not AdbServer(port=port_a, home=home_a / "adb-home" / str(port_a)).is_running()
    # b's device, server and listing are untouched by a's down
    assert _devices(env_b) == {serial_b: "device"}
    assert json.loads(_farm(env_b, "virtual", "ls", "--json"))["devices"][0]["alive"]

    _farm(env_b, "virtual", "down")
    assert not AdbServer(port=port_b, home=home_b / "adb-home" / str(port_b)).is_running()


def test_a_shared_server_stays_up_while_another_home_uses_it(tmp_path, monkeypatch):
    """Two homes whose configs name the same port share that server (a host's phone server): the
    home that started it leaves it running while the other's device is on it, and stops it on a
    later down once it serves nobody else."""
    monkeypatch.chdir(tmp_path)
    port = free_port()
    envs = []
    for name in ("a", "b"):
        config = tmp_path / f"{name}.toml"
        config.write_text(f'[farm]\nhome = "{tmp_path / name}"\n[[adb_servers]]\nport = {port}\n')
        envs.append({"PTEFARM_CONFIG": str(config), "PTEFARM_HOME": None})
    env_a, env_b = envs
    server = AdbServer(port=port, home=tmp_path / "a" / "adb-home" / str(port))
    try:
        serial_a = _up(env_a)
        serial_b = _up(env_b)
        assert set(_devices(env_a)) == {serial_a, serial_b}  # shared: one server, every device

        out = _farm(env_a, "virtual", "down")
        assert f"left running: it also serves {serial_b}" in out
        assert _devices(env_b) == {serial_b: "device"}

        _farm(env_b, "virtual", "down")  # b did not start it: b leaves it alone
        assert server.is_running()
        _farm(env_a, "virtual", "down")  # a started it, and nobody else is on it now
        assert not server.is_running()
    finally:
        for name in ("a", "b"):
            if (tmp_path / name / "virtual" / "state.json").exists():
                VirtualFarm(home=tmp_path / name, adb_port=port, tie_to_owner=False).down()
        server.stop()
