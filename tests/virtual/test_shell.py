"""Shell services of virtual devices through the real adb server: v1, v2 exit codes, exec, quoting,
and killing a command whose client went away."""

from __future__ import annotations

import os
import shlex
import time

import adbutils
import pytest

HOSTILE = [
    "it's \"quoted\"",
    "$(touch /tmp/ptefarm-pwned) `id` $HOME ${PATH}",
    "a; rm -rf /nonexistent && echo no | cat",
    "line1\nline2\n\n",
    "tabs\tand  spaces  ",
    "Grüße, 世界 — ✓ 🚀",
    "back\\slash \\n not a newline",
    "--flag -e -n",
    "*?[glob]",
]


@pytest.fixture
def device(shared_virtual_farm):
    return shared_virtual_farm.client().device(shared_virtual_farm.devices[0].serial)


def test_v2_exit_code_and_separate_stderr(device):
    r = device.shell2("echo out; echo err >&2; exit 7", v2=True)
    assert r.returncode == 7
    assert r.stdout == "out\n"
    assert r.stderr == "err\n"


def test_v2_exit_code_of_signal(device):
    assert device.shell2("kill -9 $$", v2=True).returncode == 128 + 9


def test_v1_merges_output(device):
    assert device.shell("echo out; echo err >&2") == "out\nerr"
    r = device.shell2("false")  # adbutils' v1 path: appends '; echo X4EXIT:$?'
    assert r.returncode == 1


def test_exec_is_raw(device):
    with device.open_transport() as c:
        c.send_command("exec:printf 'a\\0b\\r\\n'")
        c.check_okay()
        assert c.read_until_close(encoding=None) == b"a\0b\r\n"


def test_large_output(device):
    out = device.shell2("head -c 3000000 /dev/zero | tr '\\0' x", v2=True, rstrip=False)
    assert out.stdout == "x" * 3_000_000


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_strings_round_trip(device, text):
    r = device.shell2("printf %s " + shlex.quote(text), v2=True, encoding=None)
    assert r.returncode == 0
    assert r.stdout == text.encode()
    assert not os.path.exists("/tmp/ptefarm-pwned")


def test_empty_command_is_refused(device):
    with pytest.raises(adbutils.AdbError):
        device.shell2("", v2=True)


def test_command_killed_when_client_times_out(shared_virtual_farm, device, tmp_path):
    """The device's commands share one pid namespace, as a phone's do: a later command sees (and
    here checks) the pid an earlier one wrote."""
    remote = f"/data/local/tmp/pgid-{os.getpid()}"
    marker = shared_virtual_farm.devices[0].host_path(remote)
    marker.unlink(missing_ok=True)
    cmd = f"echo $$ > {shlex.quote(remote)}; sleep 300 & sleep 300; wait"
    with pytest.raises(adbutils.AdbTimeout):
        device.shell(cmd, timeout=1.0)
    pid = int(marker.read_text())
    deadline = time.monotonic() + 30  # eventual, not a timing assertion
    while time.monotonic() < deadline and _alive_on_device(device, pid):
        time.sleep(0.05)
    assert not _alive_on_device(device, pid), f"command {pid} survived the closed stream"
    assert device.shell2("ps -A -o args | grep -c '^sleep 300'", v2=True).stdout.strip() == "0"


def _alive_on_device(device, pid: int) -> bool:
    return device.shell2(f"kill -0 {pid}", v2=True).returncode == 0


def test_adb_cli_shell_stdin_and_exit_code(shared_virtual_farm):
    """The adb client speaks shell v2 with stdin packets and close-stdin."""
    import subprocess

    from farm.device.adb_server import adb_binary
    serial = shared_virtual_farm.devices[0].serial
    data = os.urandom(300_000)
    r = subprocess.run([adb_binary(), "-P", str(shared_virtual_farm.adb_server.port), "-s", serial,
                        "shell", "cat; exit 3"], input=data, capture_output=True,
                       env=shared_virtual_farm.server.env(), timeout=60, check=False)
    assert r.returncode == 3
    assert r.stdout == data


def test_unknown_service_is_refused(device):
    with device.open_transport() as c:
        c.send_command("framebuffer:")
        with pytest.raises(adbutils.AdbError):
            c.check_okay()
