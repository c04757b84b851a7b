"""A `--virtual` run owns its devices: one restarted from a shell while the run goes on (`farm
virtual online`) still ends with the run, whether the run ends in order or is killed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from farm.config import from_dict
from farm.session import open_farm
from farm.virtual.manager import is_device_process


def _farm_virtual(home: Path, *args: str) -> str:
    from farm.cli.main import main

    env = {"PTEFARM_HOME": str(home), "PTEFARM_CONFIG": None}
    result = CliRunner().invoke(main, ["virtual", *args], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _device(home: Path) -> tuple[str, int, Path]:
    [dev] = json.loads((home / "virtual" / "state.json").read_text())["devices"]
    return dev["serial"], dev["pid"], Path(dev["root"])


def _ends_with_its_owner(home: Path, pid: int, root: Path) -> None:
    """The device process ``pid`` ends, its owner gone (eventual: the device's watchdog polls its
    owner); whatever is left (and the adb server) is stopped either way."""
    deadline = time.monotonic() + 30
    while is_device_process(pid, root) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert not is_device_process(pid, root)
    finally:
        _farm_virtual(home, "down")


def test_a_device_restarted_from_a_shell_ends_with_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./farm.toml
    monkeypatch.setenv("PTEFARM_HOME", str(tmp_path / "home"))
    run_home = tmp_path / "run" / "farm"  # where a --virtual run keeps its devices
    with open_farm(from_dict({}), virtual=[("SM8650", 1)], workdir=tmp_path / "run", watch=False):
        serial, _, root = _device(run_home)
        _farm_virtual(run_home, "offline", serial)
        assert f"{serial}: online" in _farm_virtual(run_home, "online", serial)
        _, pid, _ = _device(run_home)
        assert is_device_process(pid, root)
    assert not is_device_process(pid, root)


def test_a_device_restarted_from_a_shell_ends_when_the_run_is_killed(tmp_path):
    home = tmp_path / "farm"
    script = (
        "import time\n"
        "from farm.virtual import VirtualFarm, VirtualDeviceSpec\n"
        f"vf = VirtualFarm(home={str(home)!r})\n"  # tied to this process, as a run's devices are
        "vf.up([VirtualDeviceSpec()])\n"
        "print('up', flush=True)\n"
        "time.sleep(300)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "up"
        serial, _, root = _device(home)
        _farm_virtual(home, "online", serial)  # a restart from a shell, the run still going
        _, pid, _ = _device(home)
        assert is_device_process(pid, root)
    finally:
        owner.kill()
        owner.wait()
    _ends_with_its_owner(home, pid, root)


def test_devices_up_with_exit_with_pid_end_with_that_process(tmp_path, monkeypatch):
    """`farm virtual up --exit-with-pid` (the main job's devices, shared by its legs): the devices and
    their adb server end when that process does, though no command that started them is left."""
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "farm"
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        _farm_virtual(home, "up", "--soc", "SM8650", "--exit-with-pid", str(owner.pid))
        serial, pid, root = _device(home)
        assert is_device_process(pid, root)
        owner_recorded = json.loads((home / "virtual" / "state.json").read_text())["owner"]
        assert owner_recorded["pid"] == owner.pid
    finally:
        owner.kill()
        owner.wait()
    _ends_with_its_owner(home, pid, root)


def test_exit_with_pid_of_no_process_starts_nothing(tmp_path, monkeypatch):
    from farm.cli.main import main

    monkeypatch.chdir(tmp_path)
    home = tmp_path / "farm"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    result = CliRunner().invoke(main, ["virtual", "up", "--exit-with-pid", str(gone.pid)],
                                env={"PTEFARM_HOME": str(home), "PTEFARM_CONFIG": None})
    assert result.exit_code == 2, result.output
    assert f"--exit-with-pid {gone.pid}: no such process" in result.output
    assert not (home / "virtual" / "state.json").exists()
