"""The farm config: defaults without a file; every bad key is named, with its file."""

from __future__ import annotations

import pytest

from farm.config import DEFAULT_ADB_PORT, load_config
from farm.errors import UsageError


def test_defaults_without_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PTEFARM_CONFIG", raising=False)
    monkeypatch.setenv("PTEFARM_HOME", str(tmp_path / "home"))
    cfg = load_config()
    assert cfg.source is None
    assert [(s.host, s.port) for s in cfg.adb_servers] == [("127.0.0.1", DEFAULT_ADB_PORT)]
    assert cfg.pool.url == f"sqlite:///{tmp_path / 'home' / 'pool.db'}"


def test_file_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "farm.toml"
    path.write_text('[[adb_servers]]\nhost = "lab-1"\nport = 5038\n[[adb_servers]]\nhost = "lab-2"\n'
                    '[pool]\nurl = "postgresql://farm@db/farm"\nlease_ttl_s = 60\n')
    monkeypatch.setenv("PTEFARM_CONFIG", str(path))
    cfg = load_config()
    assert [str(s) for s in cfg.adb_servers] == ["lab-1:5038", f"lab-2:{DEFAULT_ADB_PORT}"]
    assert cfg.pool.url.startswith("postgresql://") and cfg.pool.lease_ttl_s == 60.0
    assert cfg.source == path


@pytest.mark.parametrize("text,needle", [
    ('[pool]\nurl = "mysql://x"\n', "pool.url"),
    ('[pool]\nlease_ttl_s = -1\n', "pool.lease_ttl_s"),
    ('[pool]\nquarantine_after = "3"\n', "pool.quarantine_after"),
    ('[pool]\nttl = 5\n', "pool.ttl"),
    ('[[adb_servers]]\nport = 70000\n', "adb_servers[0].port"),
    ('[[adb_servers]]\nhost = 5\n', "adb_servers[0].host"),
    ('[run]\nworkspace = "relative/dir"\n', "run.workspace"),
    ('[farms]\nhome = "/x"\n', "farms"),
    ('[pool\nurl = 1', "invalid TOML"),
    ('[[devices]]\ntags = ["a"]\n', "farm.toml:1: key 'devices[0].serial' is missing"),
    ('[[devices]]\nserial = "x"\ntags = ["bad tag"]\n', "farm.toml:3: key 'devices[0].tags'"),
    ('[[devices]]\nserial = "x"\ntags = "flagship"\n', "farm.toml:3: key 'devices[0].tags' must be list"),
    ('[[devices]]\nserial = "x"\n[[devices]]\nserial = "x"\n', "farm.toml:4: key 'devices[1].serial'"),
    ('[[devices]]\nserial = "x"\nsoc = "SM8650"\n', "farm.toml:3: unknown key 'devices[0].soc'"),
    ('[pool]\nliveness_s = 0\n', "farm.toml:2: key 'pool.liveness_s'"),
    ('[pool]\nretention_days = "30"\n', "farm.toml:2: key 'pool.retention_days'"),
])
def test_bad_config_names_file_and_key(tmp_path, text, needle):
    path = tmp_path / "farm.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as exc:
        load_config(path)
    assert needle in str(exc.value) and str(path) in str(exc.value)


def test_explicit_missing_file(tmp_path):
    with pytest.raises(UsageError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
