"""`farm adb ARGS...`: the bundled adb against the farm's server, as a user types it (a real process:
`farm adb` execs adb, so its exit code and output are adb's own)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from farm.cli.adb import adb_env, pick_server
from farm.config import AdbServerAddress, load_config
from farm.virtual import VirtualDeviceSpec, VirtualFarm


@pytest.fixture(scope="module")
def adb_farm(tmp_path_factory):
    root = tmp_path_factory.mktemp("farm-adb")
    with VirtualFarm(home=root / "home") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        config = root / "farm.toml"
        config.write_text(f'[farm]\nhome = "{root / "home"}"\n\n'
                          f'[[adb_servers]]\nhost = "127.0.0.1"\nport = {vf.adb_server.port}\n')
        yield vf, record.serial, config, root


def _farm_adb(config, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # The user's own adb settings must not matter: farm adb picks the farm's server itself.
    base = {k: v for k, v in os.environ.items()
            if k not in ("ANDROID_SERIAL", "ADB_SERVER_SOCKET", "ANDROID_ADB_SERVER_PORT")}
    base |= {"ANDROID_ADB_SERVER_PORT": "5037", "ADB_SERVER_SOCKET": "tcp:127.0.0.1:1"}  # wrong
    return subprocess.run([sys.executable, "-m", "farm.cli.main", "adb", "--config", str(config),
                           *args], capture_output=True, text=True, timeout=60,
                          env=base | (env or {}))


def test_devices_lists_the_virtual_device(adb_farm):
    _, serial, config, _ = adb_farm
    done = _farm_adb(config, "devices", "-l")
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith(serial))
    assert line.split()[1] == "device"


def test_shell_arguments_pass_through_and_exit_code_is_adbs(adb_farm):
    _, serial, config, _ = adb_farm
    soc = _farm_adb(config, "-s", serial, "shell", "getprop", "ro.soc.model")
    assert (soc.returncode, soc.stdout.strip()) == (0, "SM8650")
    # Options after the first adb argument are adb's (or the device shell's), never farm's.
    echoed = _farm_adb(config, "-s", serial, "shell", "echo", "--config", "--help")
    assert echoed.stdout.strip() == "--config --help"
    assert _farm_adb(config, "-s", serial, "shell", "exit 7").returncode == 7
    missing = _farm_adb(config, "-s", "no-such-serial", "shell", "true")
    assert missing.returncode == 1 and "no-such-serial" in missing.stderr


def test_print_env_lets_a_script_call_plain_adb(adb_farm):
    _, serial, config, root = adb_farm
    script = (f'eval "$({sys.executable} -m farm.cli.main adb --config {config} --print-env)" && '
              f'command -v adb && adb -s {serial} shell getprop ro.board.platform')
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "ADB_SERVER_SOCKET"}
                          | {"PATH": "/usr/bin:/bin", "ADB_SERVER_SOCKET": "tcp:127.0.0.1:1"})
    assert done.returncode == 0, done.stderr
    adb_path, platform = done.stdout.split()
    assert adb_path.endswith("/adbutils/binaries/adb")
    assert platform == "pineapple"


def test_env_is_the_farm_servers_port_and_private_home(adb_farm):
    vf, _, config, _ = adb_farm
    cfg = load_config(str(config))
    env = adb_env(cfg, pick_server(cfg, None))
    assert env["ANDROID_ADB_SERVER_PORT"] == str(vf.adb_server.port)
    assert env["HOME"] == str(vf.server.home)  # the HOME the farm started its server with
    assert "ANDROID_ADB_SERVER_ADDRESS" not in env
    remote = adb_env(cfg, pick_server(cfg, "10.1.2.3:15037"))
    assert remote["ANDROID_ADB_SERVER_ADDRESS"] == "10.1.2.3"


def test_server_from_farm_pool_exec_only_when_configured(adb_farm, monkeypatch):
    vf, _, config, _ = adb_farm
    cfg = load_config(str(config))
    monkeypatch.setenv("ADB_SERVER_SOCKET", f"tcp:127.0.0.1:{vf.adb_server.port}")
    assert pick_server(cfg, None) == AdbServerAddress("127.0.0.1", vf.adb_server.port)
    monkeypatch.setenv("ADB_SERVER_SOCKET", "tcp:127.0.0.1:5037")  # the user's own server: not ours
    assert pick_server(cfg, None) == cfg.adb_servers[0]


def test_bad_use_is_exit_2_with_a_message(adb_farm):
    _, _, config, _ = adb_farm
    bare = _farm_adb(config)
    assert bare.returncode == 2 and "give adb arguments" in bare.stderr
    bad = _farm_adb(config, "--server", "nonsense", "devices")
    assert bad.returncode == 2 and "nonsense" in bad.stderr
