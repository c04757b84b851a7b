"""`farm virtual up|ls|down` end to end: no process left behind, also after a crash."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from click.testing import CliRunner

from farm.cli.virtual import parse_soc_counts, virtual
from farm.device.adb_server import AdbServer
from farm.errors import UsageError


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"farm.virtual.device" in f.read()
    except OSError:
        return False


def _invoke(args, env):
    result = CliRunner().invoke(virtual, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_up_ls_down(virtual_cli_env):
    env, home, port = virtual_cli_env
    out = _invoke(["up", "--soc", "SM8650:2", "--soc", "SM8550"], env)
    assert out.count("SM8650") == 2 and "kalama" in out
    state = json.loads((home / "virtual" / "state.json").read_text())
    assert state["adb_port"] == port and len(state["devices"]) == 3
    pids = [d["pid"] for d in state["devices"]]
    assert all(_alive(p) for p in pids)

    listed = json.loads(_invoke(["ls", "--json"], env))
    assert [d["adb_state"] for d in listed["devices"]] == ["device"] * 3
    assert all(d["alive"] for d in listed["devices"])

    _invoke(["down"], env)
    assert not any(_alive(p) for p in pids)
    assert not AdbServer(port=port, home=home / "adb-home" / str(port)).is_running()
    assert not (home / "virtual" / "state.json").exists()


@pytest.mark.parametrize("kill_adb_server", [False, True])
def test_down_after_crash(virtual_cli_env, kill_adb_server):
    env, home, port = virtual_cli_env
    _invoke(["up", "--soc", "SM8650", "--count", "2"], env)
    state = json.loads((home / "virtual" / "state.json").read_text())
    pids = [d["pid"] for d in state["devices"]]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    if kill_adb_server:
        os.kill(int((home / "adb-home" / str(port) / "server.pid").read_text()), signal.SIGKILL)
    deadline = time.monotonic() + 10  # SIGKILL is asynchronous
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    listed = json.loads(_invoke(["ls", "--json"], env))
    assert not any(d["alive"] for d in listed["devices"])
    out = _invoke(["down"], env)
    assert "stopped 2" in out
    assert not AdbServer(port=port, home=home / "adb-home" / str(port)).is_running()
    assert not (home / "virtual" / "state.json").exists()
    _invoke(["down"], env)  # nothing up: still fine


def test_unknown_soc_is_a_usage_error(virtual_cli_env):
    env, home, _ = virtual_cli_env
    result = CliRunner().invoke(virtual, ["up", "--soc", "SM1234"], env=env)
    assert isinstance(result.exception, UsageError)
    assert "SM1234" in str(result.exception)
    assert not (home / "virtual" / "state.json").exists()


def test_soc_count_pairing():
    assert parse_soc_counts((), ()) == [("SM8650", 1)]
    assert parse_soc_counts(("SM8650:2", "sm8550"), ()) == [("SM8650", 2), ("SM8550", 1)]
    assert parse_soc_counts(("SM8650", "SM8550"), (2, 3)) == [("SM8650", 2), ("SM8550", 3)]
    assert parse_soc_counts(("SM8650", "SM8550"), (2,)) == [("SM8650", 2), ("SM8550", 2)]
    with pytest.raises(UsageError, match="--count given 2 times for 3 --soc"):
        parse_soc_counts(("SM8650", "SM8550", "SM8450"), (1, 2))
    with pytest.raises(UsageError, match="SOC:N or with --count"):
        parse_soc_counts(("SM8650:2",), (1,))
    with pytest.raises(UsageError, match="positive integer"):
        parse_soc_counts(("SM8650:x",), ())


def test_registered_in_main():
    from farm.cli.main import main
    assert main.commands["virtual"] is virtual


def test_owner_killed_leaves_nothing_behind(tmp_path):
    """A test session killed -9: its devices and adb server end by themselves."""
    import subprocess
    import sys
    script = (
        "import sys, time\n"
        "from farm.virtual import VirtualFarm, VirtualDeviceSpec\n"
        f"vf = VirtualFarm(home={str(tmp_path / 'farm')!r})\n"
        "vf.up([VirtualDeviceSpec()])\n"
        "print('up', flush=True)\n"
        "time.sleep(300)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "up"
        state = json.loads((tmp_path / "farm" / "virtual" / "state.json").read_text())
        server = AdbServer(port=state["adb_port"],
                           home=tmp_path / "farm" / "adb-home" / str(state["adb_port"]))
        pids = [d["pid"] for d in state["devices"]]
        assert server.is_running() and all(_alive(p) for p in pids)
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 30  # eventual: the watchdogs poll every 0.5 s
    while (server.is_running() or any(_alive(p) for p in pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not server.is_running()
    assert not any(_alive(p) for p in pids)
