"""The farm config: one TOML file naming adb servers, the pool URL and defaults.

Looked up in this order: an explicit path, ``$PTEFARM_CONFIG``, ``./farm.toml``. Without a file the
farm runs on its own adb server on this host and an SQLite pool under the farm home.

    [farm]
    home = "~/.ptefarm"                  # state: adb HOME, virtual devices, pool.db, export cache

    [[adb_servers]]                      # one entry per host that has phones plugged in
    host = "127.0.0.1"
    port = 15037

    [pool]
    url = "sqlite:///~/.ptefarm/pool.db" # or "postgresql://user@dbhost:5432/farm"
    lease_ttl_s = 300
    acquire_timeout_s = 600
    quarantine_after = 3

    [run]
    command_timeout_s = 600
    workspace = "/data/local/tmp/ptefarm"

Every key is validated at start-up; an error names the file and the key.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import UsageError

DEFAULT_ADB_PORT = 15037  # the farm's own adb server, never the user's default 5037 unless asked
DEFAULT_WORKSPACE = "/data/local/tmp/ptefarm"


def farm_home() -> Path:
    return Path(os.environ.get("PTEFARM_HOME", "~/.ptefarm")).expanduser()


@dataclass(frozen=True)
class AdbServerAddress:
    host: str = "127.0.0.1"
    port: int = DEFAULT_ADB_PORT

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> AdbServerAddress:
        """``"host:port"`` (as the pool stores a device's server) back to an address."""
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise UsageError(f"adb server {text!r}: expected HOST:PORT")
        return cls(host, int(port))


@dataclass(frozen=True)
class PoolConfig:
    url: str
    lease_ttl_s: float = 300.0
    acquire_timeout_s: float = 600.0
    quarantine_after: int = 3


@dataclass(frozen=True)
class RunConfig:
    command_timeout_s: float = 600.0
    workspace: str = DEFAULT_WORKSPACE


@dataclass(frozen=True)
class FarmConfig:
    home: Path
    adb_servers: list[AdbServerAddress]
    pool: PoolConfig
    run: RunConfig = field(default_factory=RunConfig)
    source: Path | None = None


_KNOWN = {
    "farm": {"home"},
    "adb_servers": {"host", "port"},
    "pool": {"url", "lease_ttl_s", "acquire_timeout_s", "quarantine_after"},
    "run": {"command_timeout_s", "workspace"},
}


def _check_keys(table: dict, section: str, where: str) -> None:
    for key in table:
        if key not in _KNOWN[section]:
            raise UsageError(f"{where}: unknown key '{section}.{key}' "
                             f"(known: {', '.join(sorted(_KNOWN[section]))})")


def _get(table: dict, section: str, key: str, typ: type | tuple, default: Any, where: str,
         positive: bool = False) -> Any:
    if key not in table:
        return default
    value = table[key]
    ok = isinstance(value, typ) and not isinstance(value, bool)
    if not ok:
        raise UsageError(f"{where}: key '{section}.{key}' must be {_typename(typ)}, "
                         f"got {value!r}")
    if positive and value <= 0:
        raise UsageError(f"{where}: key '{section}.{key}' must be positive, got {value!r}")
    return value


def _typename(typ: type | tuple) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def default_pool_url(home: Path) -> str:
    return f"sqlite:///{home / 'pool.db'}"


def from_dict(raw: dict[str, Any], where: str = "<config>", source: Path | None = None) -> FarmConfig:
    for section in raw:
        if section not in _KNOWN:
            raise UsageError(f"{where}: unknown section '{section}' "
                             f"(known: {', '.join(sorted(_KNOWN))})")
    farm_t = raw.get("farm", {})
    if not isinstance(farm_t, dict):
        raise UsageError(f"{where}: 'farm' must be a table")
    _check_keys(farm_t, "farm", where)
    home = Path(_get(farm_t, "farm", "home", str, str(farm_home()), where)).expanduser()

    servers_raw = raw.get("adb_servers", [{}])
    if not isinstance(servers_raw, list) or not servers_raw:
        raise UsageError(f"{where}: 'adb_servers' must be a non-empty array of tables")
    servers = []
    for i, s in enumerate(servers_raw):
        if not isinstance(s, dict):
            raise UsageError(f"{where}: 'adb_servers[{i}]' must be a table")
        _check_keys(s, "adb_servers", where)
        host = _get(s, f"adb_servers[{i}]", "host", str, "127.0.0.1", where)
        port = _get(s, f"adb_servers[{i}]", "port", int, DEFAULT_ADB_PORT, where, positive=True)
        if port > 65535:
            raise UsageError(f"{where}: key 'adb_servers[{i}].port' must be <= 65535, got {port}")
        servers.append(AdbServerAddress(host, port))

    pool_t = raw.get("pool", {})
    if not isinstance(pool_t, dict):
        raise UsageError(f"{where}: 'pool' must be a table")
    _check_keys(pool_t, "pool", where)
    url = _get(pool_t, "pool", "url", str, default_pool_url(home), where)
    if not url.startswith(("sqlite://", "postgresql://", "postgres://")):
        raise UsageError(f"{where}: key 'pool.url' must start with sqlite:// or postgresql://, "
                         f"got {url!r}")
    pool = PoolConfig(
        url=url,
        lease_ttl_s=float(_get(pool_t, "pool", "lease_ttl_s", (int, float), 300.0, where, True)),
        acquire_timeout_s=float(_get(pool_t, "pool", "acquire_timeout_s", (int, float), 600.0,
                                     where, True)),
        quarantine_after=_get(pool_t, "pool", "quarantine_after", int, 3, where, True),
    )
    run_t = raw.get("run", {})
    if not isinstance(run_t, dict):
        raise UsageError(f"{where}: 'run' must be a table")
    _check_keys(run_t, "run", where)
    run = RunConfig(
        command_timeout_s=float(_get(run_t, "run", "command_timeout_s", (int, float), 600.0,
                                     where, True)),
        workspace=_get(run_t, "run", "workspace", str, DEFAULT_WORKSPACE, where),
    )
    if not run.workspace.startswith("/"):
        raise UsageError(f"{where}: key 'run.workspace' must be an absolute device path")
    return FarmConfig(home=home, adb_servers=servers, pool=pool, run=run, source=source)


def load_config(path: str | os.PathLike | None = None) -> FarmConfig:
    """Load and validate the farm config; with no file anywhere, the single-host defaults."""
    candidates = [path] if path else [os.environ.get("PTEFARM_CONFIG"), "farm.toml"]
    for c in candidates:
        if not c:
            continue
        p = Path(c).expanduser()
        if not p.exists():
            if path or c == os.environ.get("PTEFARM_CONFIG"):
                raise UsageError(f"{p}: config file not found")
            continue
        try:
            raw = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{p}: invalid TOML: {e}") from None
        except OSError as e:
            raise UsageError(f"{p}: cannot read config: {e}") from None
        return from_dict(raw, where=str(p), source=p)
    return from_dict({})
