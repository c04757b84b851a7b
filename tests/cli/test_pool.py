"""``farm pool`` commands against a real pool (both backends); discovery is replaced by fixed scans."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from farm.config import AdbServerAddress
from farm.device.discovery import ServerScan
from farm.device.probe import DeviceInfo
from farm.pool import Pool
from tests.support.pool import fake_device


@pytest.fixture
def cli(pool_cli):
    return pool_cli


def _seed(pool_url: str, *serials: str) -> None:
    with Pool.open(pool_url) as p:
        p.sync([fake_device(s) for s in serials])


def test_lease_status_release_history(cli, pool_url):
    _seed(pool_url, "dev0")
    code, out, _ = cli("lease", "--soc", "sm8650", "--ttl", "60", "--timeout", "1",
                        "--purpose", "nightly run", "--format", "env")
    assert code == 0
    assert all(line.startswith("export ") for line in out.splitlines())
    env = dict(shlex.split(line)[1].split("=", 1) for line in out.splitlines())
    token = env["PTEFARM_LEASE"]
    assert env["ANDROID_SERIAL"] == "dev0" and env["ADB_SERVER_SOCKET"] == "tcp:127.0.0.1:15037"
    assert env["ANDROID_ADB_SERVER_PORT"] == "15037"

    code, out, _ = cli("status", "--json")
    assert code == 0
    device = json.loads(out)["devices"][0]
    assert device["state"] == "leased" and device["lease"]["token"] == token
    assert device["lease"]["holder"]["purpose"] == "nightly run"
    code, out, _ = cli("status")
    assert code == 0 and "dev0" in out and "nightly run" in out

    code, _, err = cli("lease", "--timeout", "0")
    assert code == 3 and "LeaseTimeout" in err and "dev0 leased" in err

    assert cli("renew", token, "--ttl", "120")[0] == 0
    code, out, _ = cli("release", token)
    assert code == 0 and "dev0: released" in out
    code, _, err = cli("release", token)
    assert code == 2 and "was released" in err and "LeaseError" in err

    code, out, err = cli("lease", "--format", "token", "--timeout", "0")
    assert code == 0 and len(out.strip()) == 32  # the token alone on stdout: TOKEN=$(farm pool lease)
    assert "leased dev0 (SM8650" in err
    assert cli("release", out.strip())[0] == 0

    code, out, _ = cli("history", "--serial", "dev0", "--json")
    kinds = [e["kind"] for e in json.loads(out)]
    assert kinds == ["added", "leased", "released", "leased", "released"]
    code, out, _ = cli("history")
    assert code == 0 and "released" in out and "dev0 leased -> available" in out


def test_quarantine_and_restore(cli, pool_url):
    _seed(pool_url, "dev0")
    assert cli("quarantine", "dev0", "--reason", "battery swelling")[0] == 0
    code, _, err = cli("lease", "--serial", "dev0", "--timeout", "0")
    assert code == 3 and "battery swelling" in err
    assert cli("restore", "dev0") == (0, "dev0: available\n", "")
    code, _, err = cli("quarantine", "nosuch", "--reason", "x")
    assert code == 2 and "nosuch" in err


def test_sync_uses_configured_servers(cli, pool_url, tmp_path, monkeypatch):
    import farm.session as session_module  # `farm pool sync` discovers through farm.session

    good, bad = AdbServerAddress("127.0.0.1", 15101), AdbServerAddress("127.0.0.1", 15102)
    config = tmp_path / "farm.toml"
    config.write_text(f'[[adb_servers]]\nport = {good.port}\n[[adb_servers]]\nport = {bad.port}\n')
    scans = {
        good: ServerScan(good, [DeviceInfo(serial="vd-1", server=str(good), soc="SM8650",
                                           htp_arch="v75", model="Virtual", virtual=True),
                                DeviceInfo(serial="vd-2", server=str(good), state="unauthorized")]),
        bad: ServerScan(bad, [], error=f"adb server {bad} unreachable: connection refused"),
    }
    monkeypatch.setattr(session_module, "scan_server", lambda server, **kw: scans[server])
    with Pool.open(pool_url) as p:
        p.sync([fake_device("old", "SM8550", "v73", server=str(bad))])
    code, out, err = cli("--config", str(config), "sync")
    assert code == 3 and f"adb server {bad} unreachable" in err  # reported, not hidden
    assert "added: vd-1, vd-2" in out and "offline: old" in out
    assert "1 device(s) present on 1 of 2 adb server(s)" in out
    with Pool.open(pool_url) as p:
        states = {d.device.serial: (d.device.state, d.device.reason) for d in p.status().devices}
    assert states["vd-1"] == ("available", "")
    assert states["vd-2"][0] == "offline" and "unauthorized" in states["vd-2"][1]
    assert states["old"][0] == "offline"


def test_config_and_url_are_accepted_before_and_after_the_subcommand(pool_url, tmp_path, monkeypatch):
    from farm.cli.main import main

    monkeypatch.delenv("PTEFARM_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    _seed(pool_url, "dev0")
    config = tmp_path / "farm.toml"
    config.write_text(f'[farm]\nhome = "{tmp_path / "home"}"\n[pool]\nurl = "{pool_url}"\n')
    for args in (["pool", "--config", str(config), "status", "--json"],
                 ["pool", "status", "--config", str(config), "--json"],
                 ["pool", "status", "--json", "--url", pool_url],
                 ["pool", "--config", str(tmp_path / "missing.toml"), "status", "--config", str(config),
                  "--json"]):  # the sub-command's value wins
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
        assert [d["serial"] for d in json.loads(result.stdout)["devices"]] == ["dev0"], args
    missing = CliRunner().invoke(main, ["pool", "status", "--config", str(tmp_path / "missing.toml")])
    assert missing.exit_code == 2 and "missing.toml: config file not found" in missing.output
