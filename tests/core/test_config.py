"""The farm config: defaults without a file; every bad key is named, with its file."""

from __future__ import annotations

import pytest

from farm.config import ADB_PORT_FILE, DEFAULT_ADB_PORT, MAX_CONFIG_BYTES, load_config
from farm.errors import UsageError


def _defaults(monkeypatch, home):
    monkeypatch.delenv("PTEFARM_CONFIG", raising=False)
    monkeypatch.setenv("PTEFARM_HOME", str(home))
    return load_config()


def test_defaults_without_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _defaults(monkeypatch, tmp_path / "home")
    assert cfg.source is None
    [server] = cfg.adb_servers
    assert server.host == "127.0.0.1"
    assert server.port == int((tmp_path / "home" / ADB_PORT_FILE).read_text())
    assert cfg.pool.url == f"sqlite:///{tmp_path / 'home' / 'pool.db'}"


def test_each_farm_home_has_its_own_adb_port_kept_across_runs(tmp_path, monkeypatch):
    """Two homes on one host never share an adb server by default (they would see, and stop, each
    other's devices); a home keeps its port, so its server, `farm adb` and the pool agree on it."""
    monkeypatch.chdir(tmp_path)
    a = _defaults(monkeypatch, tmp_path / "a").adb_servers[0].port
    b = _defaults(monkeypatch, tmp_path / "b").adb_servers[0].port
    assert a != b and DEFAULT_ADB_PORT not in (a, b) and 5037 not in (a, b)
    assert _defaults(monkeypatch, tmp_path / "a").adb_servers[0].port == a
    # a config that names this host's server without a port means the home's own server too
    config = tmp_path / "farm.toml"
    config.write_text(f'[farm]\nhome = "{tmp_path / "b"}"\n[[adb_servers]]\nhost = "127.0.0.1"\n')
    assert [s.port for s in load_config(config).adb_servers] == [b]


def test_a_configured_adb_port_is_used_as_given(tmp_path):
    """A port written in the config is a shared server (the host's phones): every home uses it, and
    no port file is made."""
    config = tmp_path / "farm.toml"
    config.write_text(f'[farm]\nhome = "{tmp_path / "home"}"\n[[adb_servers]]\nport = 15100\n'
                      f'[[adb_servers]]\nhost = "phones-2.lab"\n')
    assert [str(s) for s in load_config(config).adb_servers] == [
        "127.0.0.1:15100", f"phones-2.lab:{DEFAULT_ADB_PORT}"]
    assert not (tmp_path / "home" / ADB_PORT_FILE).exists()


def test_a_corrupt_home_adb_port_file_is_named(tmp_path, monkeypatch):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ADB_PORT_FILE).write_text("99999\n")
    with pytest.raises(UsageError, match=f"{tmp_path / 'home' / ADB_PORT_FILE}: not an adb server port"):
        _defaults(monkeypatch, tmp_path / "home")


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
    ('[recovery]\nrungs = ["return", "wait"]\n', "farm.toml:2: key 'recovery.rungs': recovery rung(s) 'wait'"),
    ('[recovery]\nrungs = ["reboot", "boot"]\n', "in the order return, boot, reboot"),
    ('[recovery]\nrungs = [1]\n', "farm.toml:2: key 'recovery.rungs' must be a list of rung names"),
    ('[recovery]\nrungs = "reboot"\n', "farm.toml:2: key 'recovery.rungs' must be list"),
    ('[recovery]\nboot_timeout_s = 0\n', "farm.toml:2: key 'recovery.boot_timeout_s'"),
    ('[recovery]\nwait_s = 5\n', "farm.toml:2: unknown key 'recovery.wait_s'"),
    ('[deploy]\nchunk_min_bytes = "16M"\n', "farm.toml:2: key 'deploy.chunk_min_bytes' must be a size"),
    ('[deploy]\nchunk_min_bytes = -1\n', "farm.toml:2: key 'deploy.chunk_min_bytes'"),
    ('[deploy]\nchunk_store_bytes = 0\n', "farm.toml:2: key 'deploy.chunk_store_bytes'"),
    ('[deploy]\nchunks = true\n', "farm.toml:2: unknown key 'deploy.chunks'"),
])
def test_bad_config_names_file_and_key(tmp_path, text, needle):
    path = tmp_path / "farm.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as exc:
        load_config(path)
    assert needle in str(exc.value) and str(path) in str(exc.value)


def test_the_recovery_ladder_is_configured_per_farm(tmp_path):
    path = tmp_path / "farm.toml"
    path.write_text('[recovery]\nrungs = ["boot", "reboot"]\nreboot_timeout_s = 90\n')
    ladder = load_config(path).recovery
    assert ladder.rungs == ("boot", "reboot") and ladder.reboot_timeout_s == 90.0
    assert ladder.return_timeout_s == 60.0 and ladder.probe_timeout_s == 10.0  # the defaults
    path.write_text('[recovery]\nrungs = []\n')
    assert load_config(path).recovery.rungs == ()  # quarantine by the count alone


def test_chunked_deploy_is_configured_per_farm_and_the_environment_overrides_the_threshold(tmp_path):
    from farm.execute.chunking import MIN_BYTES_ENV, ChunkPolicy

    path = tmp_path / "farm.toml"
    path.write_text('[deploy]\nchunk_min_bytes = 1048576\nchunk_store_bytes = 2147483648\n')
    policy = ChunkPolicy.configured(load_config(path).deploy, env={})
    assert policy.min_file_bytes == 1 << 20 and policy.store_bytes == 2 << 30
    assert ChunkPolicy.configured(load_config(path).deploy, env={MIN_BYTES_ENV: "off"}) \
        == ChunkPolicy(min_file_bytes=None, store_bytes=2 << 30)
    path.write_text('[deploy]\nchunk_min_bytes = "off"\n')
    assert not ChunkPolicy.configured(load_config(path).deploy, env={}).chunks(1 << 40)
    path.write_text("")
    assert ChunkPolicy.configured(load_config(path).deploy, env={}) == ChunkPolicy()  # the defaults


def test_explicit_missing_file(tmp_path):
    with pytest.raises(UsageError, match="config file not found"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize("text,key", [
    ('[pool]\nurl = "{big}"\n', "pool.url"),
    ('[pool]\nurl = "sqlite:///{big}"\n', "pool.url"),
    ('[pool]\nurl = "postgresql://{big}/farm"\n', "pool.url"),
    ('[farm]\nhome = "{big}"\n', "farm.home"),
    ('[run]\nworkspace = "/{big}"\n', "run.workspace"),
    ('[[adb_servers]]\nhost = "{big}"\n', "adb_servers[0].host"),
    ('[[devices]]\nserial = "{big}"\n', "devices[0].serial"),
    ('[[devices]]\nserial = "x"\ntags = ["{big}"]\n', "devices[0].tags"),
    ('[pool]\n"{big}" = 1\n', "unknown key 'pool."),
])
def test_a_huge_config_string_is_refused_with_a_short_excerpt(tmp_path, text, key):
    """A 100 kB value (a pasted file, a runaway template) is one short line naming the file and the
    key, with a clearly cut excerpt: never the value whole (once printed it was 100 MB of stderr)."""
    big = "x" * 100_000
    path = tmp_path / "farm.toml"
    path.write_text(text.format(big=big))
    with pytest.raises(UsageError) as exc:
        load_config(path)
    message = str(exc.value)
    assert str(path) in message and key in message
    assert len(message) < 400 and "cut" in message


def test_an_oversized_config_file_is_refused_unread(tmp_path):
    path = tmp_path / "farm.toml"
    path.write_text('[pool]\nlease_ttl_s = 60\n' + "# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    with pytest.raises(UsageError, match=f"{path}: config is larger than {MAX_CONFIG_BYTES} bytes"):
        load_config(path)
