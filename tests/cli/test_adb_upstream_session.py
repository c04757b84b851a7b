"""The plain adb CLI (the binary bundled in adbutils) against a virtual device, as an upstream user
drives a phone: Android paths, exit codes, with and without a pty, wait-for-device, get-state,
reboot; the upstream flow (wipe and create a workspace, push, cd && export && ./runner, pull) gives
byte for byte what the farm's own path gives. Also `farm virtual reboot|offline|online|set`."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time

import pytest
from click.testing import CliRunner

from farm.bundle import manifest as bundle_mod
from farm.cli.virtual import virtual
from farm.device.adb_server import adb_binary
from farm.device.discovery import find_device
from farm.execute.deploy import deploy
from farm.execute.run import run
from farm.execute.runprofile import OUTPUTS, RunRequest, runner_argv
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.virtual.manager import is_device_process

# What an upstream script pushes as its runner: here, the farm's host runner behind the name.
WRAPPER = '#!/system/bin/sh\nexec farm-llama-runner "$@"\n'


@pytest.fixture(scope="module")
def phone(tmp_path_factory):
    with VirtualFarm(home=tmp_path_factory.mktemp("adb-cli")) as vf:
        (dev,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        yield vf, dev


def adb(vf, serial: str | None, *args: str, input: bytes | None = None, timeout: float = 120,
        check: bool = True) -> subprocess.CompletedProcess:
    """The bundled adb, pointed at the farm's server as a user would: ANDROID_ADB_SERVER_PORT, and
    the server's private HOME (its adbkey), never the user's."""
    env = {**vf.server.env(), "ANDROID_ADB_SERVER_PORT": str(vf.adb_server.port)}
    argv = [adb_binary(), *(["-s", serial] if serial else []), *args]
    done = subprocess.run(argv, env=env, input=input, capture_output=True, timeout=timeout,
                          check=False)
    if check:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def test_upstream_flow_is_byte_exact_with_the_farms(phone, tiny_bundle, tmp_path):
    vf, dev = phone
    bundle = bundle_mod.load(tiny_bundle)
    request = RunRequest(prompts=["Once upon a time"], mode="hybrid", seq_len=48)
    device = find_device([vf.adb_server], dev.serial)
    deploy(device, bundle)
    farm_result = run(device, bundle, request, timeout=300)
    assert farm_result.text_bytes

    ws = "/data/local/tmp/upstream-ws"
    adb(vf, dev.serial, "shell", f"rm -rf {ws} && mkdir -p {ws}")
    for f in bundle.files:
        adb(vf, dev.serial, "push", str(f.path), f"{ws}/{f.name}")
    wrapper = tmp_path / "qnn_llama_runner"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)  # adb push keeps the mode
    adb(vf, dev.serial, "push", str(wrapper), f"{ws}/qnn_llama_runner")
    argv, _ = runner_argv(bundle, request, ".")
    command = (f"cd {ws} && export LD_LIBRARY_PATH=. ADSP_LIBRARY_PATH=. && "
               f"./qnn_llama_runner {shlex.join(argv[1:])}")
    ran = adb(vf, dev.serial, "shell", command, timeout=300)
    assert b"PyTorchObserver" in ran.stdout
    adb(vf, dev.serial, "pull", f"{ws}/{OUTPUTS}", str(tmp_path / OUTPUTS))
    assert (tmp_path / OUTPUTS).read_bytes() == farm_result.text_bytes
    # and it all happened in the device's storage, on the host side of it
    assert (dev.host_path(ws) / OUTPUTS).read_bytes() == farm_result.text_bytes


def test_exit_codes_and_getprop(phone):
    vf, dev = phone
    assert adb(vf, dev.serial, "shell", "false; echo $?").stdout == b"1\n"
    assert adb(vf, dev.serial, "shell", "exit 7", check=False).returncode == 7
    assert adb(vf, dev.serial, "shell", "getprop", "ro.soc.model").stdout == b"SM8650\n"
    assert adb(vf, dev.serial, "shell", "getprop ro.ptefarm.workspace").stdout == \
        b"/data/local/tmp/ptefarm\n"
    assert adb(vf, dev.serial, "get-state").stdout == b"device\n"
    adb(vf, dev.serial, "wait-for-device", timeout=30)
    assert dev.serial.encode() in adb(vf, None, "devices").stdout


def test_shell_with_and_without_a_pty(phone):
    vf, dev = phone
    probe = "test -t 0 && echo pty || echo no-pty; echo $TERM; exit 3"
    with_pty = adb(vf, dev.serial, "shell", "-tt", probe, check=False)
    assert with_pty.returncode == 3 and with_pty.stdout.split(b"\r\n")[0] == b"pty"
    without = adb(vf, dev.serial, "shell", "-T", probe, check=False)
    assert without.returncode == 3 and without.stdout.split(b"\n")[0] == b"no-pty"
    # An interactive shell (no command) on a pty, fed from stdin.
    interactive = adb(vf, dev.serial, "shell", "-tt", input=b"echo hi-$((6*7))\nexit 5\n",
                      check=False)
    assert interactive.returncode == 5 and b"hi-42" in interactive.stdout
    # stdin through the v2 protocol without a pty, binary-safe
    data = os.urandom(100_000)
    assert adb(vf, dev.serial, "shell", "cat", input=data).stdout == data


def test_writes_outside_the_storage_fail_from_the_cli(phone, tmp_path):
    vf, dev = phone
    for command in ("echo x > /etc/x", "echo x > ../../x", "mkdir /system/x"):
        r = adb(vf, dev.serial, "shell", command, check=False)
        assert r.returncode != 0 and b"Read-only file system" in r.stderr, (command, r.stderr)
    src = tmp_path / "x"
    src.write_bytes(b"x")
    for target in ("/etc/x", "/data/../etc/x", "../../x"):
        r = adb(vf, dev.serial, "push", str(src), target, check=False)
        assert r.returncode != 0, target
    assert not os.path.exists("/etc/x") and not os.path.exists("/x")
    assert b"uid=2000(shell)" in adb(vf, dev.serial, "shell", "id").stdout


def test_adb_reboot_keeps_storage_and_ends_the_previous_boot(phone, tmp_path):
    vf, dev = phone
    (tmp_path / "keep").write_bytes(b"kept across reboot")
    adb(vf, dev.serial, "push", str(tmp_path / "keep"), "/data/local/tmp/keep")
    # The command returns only once the sleep is in a session of its own (the flag is touched after
    # setsid): the end of the shell command kills its process group, and a child still in it would be
    # killed with it, before the reboot the test is about.
    adb(vf, dev.serial, "shell",
        "setsid sh -c 'touch /data/local/tmp/started; exec sleep 977' </dev/null >/dev/null 2>&1 & "
        "while [ ! -e /data/local/tmp/started ]; do sleep 0.05; done")
    assert b"sleep 977" in adb(vf, dev.serial, "shell", "ps -A -o args").stdout
    adb(vf, dev.serial, "reboot")
    assert adb(vf, dev.serial, "get-state", check=False).stdout != b"device\n"  # it went away
    adb(vf, dev.serial, "wait-for-device", timeout=60)
    assert adb(vf, dev.serial, "shell", "cat /data/local/tmp/keep").stdout == b"kept across reboot"
    ps = adb(vf, dev.serial, "shell", "ps -A -o args").stdout
    assert b"sleep 977" not in ps  # nothing of the previous boot runs
    (status,) = vf.ls()
    assert status.alive and status.adb_state == "device" and status.process.pid == dev.pid
    assert is_device_process(dev.pid, dev.root)


# --- farm virtual reboot|offline|online|set ------------------------------------------------------------



def _invoke(args, env) -> str:
    result = CliRunner().invoke(virtual, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_cli_offline_online_reboot_and_set(virtual_cli_env):
    env, home, port = virtual_cli_env
    _invoke(["up", "--soc", "SM8650"], env)
    vf = VirtualFarm(home=home, adb_port=port, tie_to_owner=False)
    (dev,) = vf.devices
    client = vf.client().device(dev.serial)
    client.sync.push(b"stays", "/data/local/tmp/stays")

    _invoke(["offline", dev.serial], env)
    assert not is_device_process(dev.pid, dev.root)
    vf.server.wait_for_state(dev.serial, "offline", timeout=30)
    out = _invoke(["online", dev.serial], env)
    assert "online" in out
    assert vf.client().device(dev.serial).sync.read_bytes("/data/local/tmp/stays") == b"stays"

    started = time.monotonic()
    assert "rebooted" in _invoke(["reboot", dev.serial], env)
    assert time.monotonic() - started < 60
    assert VirtualFarm(home=home, adb_port=port).server.devices()[dev.serial] == "device"

    state = json.loads(_invoke(["set", dev.serial, "--battery-temp", "45.5", "--battery-level", "20",
                                "--thermal", "nsphvx-0=90", "--json"], env))
    assert state["battery_temp_c"] == 45.5 and state["battery_level"] == 20
    info = find_device([vf.adb_server], dev.serial).info()
    assert info.battery_temp_c == 45.5 and info.thermal["nsphvx-0"] == 90
    bad = CliRunner().invoke(virtual, ["set", dev.serial, "--thermal", "cpu=hot"], env=env)
    assert bad.exit_code == 2 and "ZONE=DEGREES_C" in bad.output
