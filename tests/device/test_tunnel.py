"""An adb server reached over SSH (farm.device.tunnel): an OpenSSH server of the test's own stands for
the phones' host, whose adb server (a virtual farm's) listens on its loopback only. The farm forwards a
port of this host's loopback to it, lists and leases its devices, and when the forward dies mid-test
the test's attempt is an infrastructure error, the forward is started again and the re-run passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from farm.config import SshTunnelConfig, load_config
from farm.device.tunnel import CHECK_INTERVAL_S, START_TIMEOUT_S, close_tunnels, ensure_tunnels, ssh_argv
from farm.errors import AdbServerDown, UsageError
from farm.exitcodes import ExitCode
from farm.virtual import VirtualDeviceSpec
from farm.virtual.manager import free_port
from tests.support.plugin import explain, junit_cases, results_json, run_pytest
from tests.support.sshd import start_sshd, stop_sshd


@pytest.fixture
def sshd(tmp_path):
    server = start_sshd(tmp_path / "sshd")
    yield server
    close_tunnels()
    stop_sshd(server)


@pytest.fixture
def remote(virtual_farm):
    """The phones' host's adb server, on its loopback, with two devices."""
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8550")])
    return virtual_farm


def _config(tmp_path, sshd, remote, **kwargs) -> str:
    # A local port free now rather than the one derived from the target: the derived ports' range
    # overlaps the ports the suite's other virtual farms and outgoing connections take, and a port
    # some other process holds would fail a test that has nothing to do with it.
    kwargs.setdefault("local_port", free_port())
    path = tmp_path / "farm.toml"
    path.write_text(f'[farm]\nhome = "{tmp_path / "home"}"\n\n' + sshd.adb_entry(remote.adb_server.port, **kwargs)
                    + f'\n[pool]\nurl = "sqlite:///{tmp_path / "pool.db"}"\n')
    return str(path)


def _farm(*args: str, config: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PTEFARM_CONFIG": config}
    return subprocess.run([sys.executable, "-m", "farm.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def _forwards(local_port: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        argv = p.info["cmdline"] or []
        if argv[:1] == ["ssh"] and any(a.startswith(f"127.0.0.1:{local_port}:") for a in argv):
            found.append(p)
    return found


def test_ssh_argv_forwards_loopback_only_and_never_reads_the_target_as_an_option():
    t = SshTunnelConfig(target="farm@phones-3", local_port=25037, remote_port=15037, ssh_port=2222,
                        identity="/k/id", known_hosts="/k/hosts")
    argv = ssh_argv(t)
    assert argv[argv.index("-L") + 1] == "127.0.0.1:25037:127.0.0.1:15037"
    assert argv[-2:] == ["--", "farm@phones-3"]
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv
    assert "UserKnownHostsFile=/k/hosts" in argv and argv[argv.index("-i") + 1] == "/k/id"


@pytest.mark.parametrize("entry, message", [
    ('ssh = "-oProxyCommand=touch /tmp/x"', "must be user@host or host"),
    ('ssh = "a@b"\nhost = "c"', "reached through the forward on this host"),
    ('host = "c"\nremote_port = 1', "is for an entry reached over SSH"),
    ('ssh = "a@b"\nremote_port = 70000', "must be <= 65535"),
])
def test_a_bad_ssh_entry_is_refused_naming_the_key(tmp_path, entry, message):
    path = tmp_path / "farm.toml"
    path.write_text(f"[[adb_servers]]\n{entry}\n")
    with pytest.raises(UsageError, match=message):
        load_config(path)


def test_two_entries_ending_on_one_local_port_are_refused(tmp_path):
    path = tmp_path / "farm.toml"
    path.write_text('[[adb_servers]]\nssh = "a@b"\nlocal_port = 25000\n\n[[adb_servers]]\nssh = "a@c"\n'
                    "local_port = 25000\n")
    with pytest.raises(UsageError, match="own local_port"):
        load_config(path)


def test_farm_devices_lists_the_phones_of_a_host_reached_over_ssh(tmp_path, sshd, remote):
    config = _config(tmp_path, sshd, remote)
    [tunnel] = load_config(config).tunnels
    proc = _farm("devices", "--json", config=config)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert [s["server"] for s in listed["servers"]] == [f"127.0.0.1:{tunnel.local_port}"]
    assert sorted(d["soc"] for d in listed["devices"]) == ["SM8550", "SM8650"]
    assert not _forwards(tunnel.local_port)  # the command's forward ended with it


def test_farm_adb_and_pool_exec_open_the_forward_to_the_server_they_talk_to(tmp_path, sshd, remote):
    """``farm adb`` (which becomes adb) and the command of ``farm pool exec`` talk to the SSH-reached
    server through a forward they open: without it, adb would find nothing on the forward's port and
    start a local server of its own there. Each forward ends with its command."""
    config = _config(tmp_path, sshd, remote)
    [tunnel] = load_config(config).tunnels
    assert not _forwards(tunnel.local_port)
    serials = sorted(d.process.serial for d in remote.ls())
    proc = _farm("adb", "devices", config=config)
    assert proc.returncode == 0, proc.stderr
    listed = sorted(line.split("\t")[0] for line in proc.stdout.splitlines() if line.endswith("\tdevice"))
    assert listed == serials
    assert "daemon" not in proc.stdout + proc.stderr  # no local server started on the forward's port
    assert psutil.wait_procs(_forwards(tunnel.local_port), timeout=10)[1] == []  # gone with adb

    proc = _farm("pool", "exec", "--soc", "SM8650", "--", "sh", "-c",
                 'adb shell getprop ro.soc.model', config=config)  # the farm's adb, first on PATH
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "SM8650"
    assert psutil.wait_procs(_forwards(tunnel.local_port), timeout=10)[1] == []


def test_a_host_key_that_is_not_known_is_an_infrastructure_error_naming_the_forward(tmp_path, sshd, remote):
    stranger = tmp_path / "other_known_hosts"
    stranger.write_text("")
    proc = _farm("devices", config=_config(tmp_path, sshd, remote, known_hosts=stranger))
    assert proc.returncode == ExitCode.INFRA, proc.stderr
    assert "over SSH" in proc.stderr and "Host key verification failed" in proc.stderr, proc.stderr


def test_the_forward_listens_on_loopback_and_is_started_again_when_it_dies(tmp_path, sshd, remote):
    [tunnel] = ensure_tunnels(load_config(_config(tmp_path, sshd, remote)).tunnels, log_dir=tmp_path / "t")
    port = tunnel.config.local_port
    listening = [c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert listening and all(c.laddr.ip in ("127.0.0.1", "::1") for c in listening)
    [ssh] = _forwards(port)
    ssh.kill()
    ssh.wait(5)
    assert psutil.wait_procs([ssh], timeout=5)
    from farm import procs

    # The supervisor looks every CHECK_INTERVAL_S and gives ssh START_TIMEOUT_S to come up.
    assert procs.wait_until(lambda: len(_forwards(port)) == 1 and tunnel.alive(),
                            timeout=CHECK_INTERVAL_S + START_TIMEOUT_S + 5)
    assert tunnel.state.restarts >= 1
    with pytest.raises(AdbServerDown, match="did not come up"):
        bad = SshTunnelConfig(target=sshd.target, local_port=free_port(), remote_port=remote.adb_server.port,
                              ssh_port=sshd.port, identity=str(tmp_path / "no-such-key"),
                              known_hosts=str(sshd.known_hosts))
        ensure_tunnels([bad], log_dir=tmp_path / "t")


KILL_THE_FORWARD_ONCE = """
import os, pathlib, psutil

def test_device_over_ssh(device):
    assert device.adb.shell("echo hi", timeout=10, check=True).out.strip() == "hi"
    flag = pathlib.Path(os.environ["KILL_FLAG"])
    if not flag.exists():
        flag.write_text("killed")
        for p in psutil.process_iter(["cmdline"]):
            argv = p.info["cmdline"] or []
            if argv[:1] == ["ssh"] and any(a.startswith(os.environ["FORWARD"] + ":") for a in argv):
                p.kill()
                p.wait(5)
    assert device.adb.shell("echo again", timeout=10, check=True).out.strip() == "again"
"""


def test_the_forward_dying_mid_test_is_an_infrastructure_error_and_the_rerun_passes(tmp_path, sshd, remote):
    # A port free now, not the one derived from the target: on a busy host another process held
    # that one once ("Address already in use"), which is not what this test is about.
    config = _config(tmp_path, sshd, remote, local_port=free_port())
    [tunnel] = load_config(config).tunnels
    (tmp_path / "test_over_ssh.py").write_text(KILL_THE_FORWARD_ONCE)
    out = tmp_path / "out"
    proc = run_pytest(["test_over_ssh.py", "-p", "no:xdist", "--farm-config", config, "--farm-soc", "SM8650",
                       "--farm-out", str(out), "--farm-results-url", "none", "--farm-retry-delay", "2"],
                      cwd=tmp_path, env={"KILL_FLAG": str(tmp_path / "killed"),
                                         "FORWARD": f"127.0.0.1:{tunnel.local_port}"})
    assert proc.returncode == 0, explain(proc)
    [case] = junit_cases(out)
    assert case.outcome == "passed"
    [record] = results_json(out)["results"]
    [spoiled] = record["attempts"]  # the attempt the dead forward spoiled: infrastructure, not the test
    assert "adb server" in spoiled["reason"].lower() or "127.0.0.1" in spoiled["reason"], spoiled
