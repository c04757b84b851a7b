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
    liveness_s = 120                     # lease only devices seen (synced, or used) this recently
    retention_days = 30                  # `farm pool prune`: rows of devices offline this long

    [results]                            # the results store (farm history, farm baseline)
    retention_days = 180                 # runs older than this are pruned; named baselines never

    [[devices]]                          # optional, per phone: tags the pool matches requests on
    serial = "R5CW1234ABC"
    tags = ["flagship", "usb3"]

    [run]
    command_timeout_s = 600
    workspace = "/data/local/tmp/ptefarm"

Every key is validated at start-up; an error names the file, the line where the key is (when the
file has it) and the key: ``farm.toml:7: key 'pool.lease_ttl_s' must be a finite positive number``.
Numbers must be finite and positive (TOML allows ``inf`` and ``nan``; the farm does not).
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import UsageError

DEFAULT_ADB_PORT = 15037  # the farm's own adb server, never the user's default 5037 unless asked
DEFAULT_WORKSPACE = "/data/local/tmp/ptefarm"
# The defaults of [pool] and [run], here and nowhere else (the pool and the sessions take the
# config's dataclasses, never numbers of their own).
DEFAULT_LEASE_TTL_S = 300.0
DEFAULT_ACQUIRE_TIMEOUT_S = 600.0
DEFAULT_QUARANTINE_AFTER = 3
DEFAULT_LIVENESS_S = 120.0  # a device not seen (synced, or used) this long is not leased
DEFAULT_COMMAND_TIMEOUT_S = 600.0
DEFAULT_RETENTION_DAYS = 30.0
DEFAULT_RESULTS_RETENTION_DAYS = 180.0  # stored runs; named baselines are kept whatever their age
# A device tag: what `farm pool tag` and `[[devices]] tags` accept (no spaces or commas: tags are
# listed comma-separated).
TAG_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}")


def tag_problem(tag: object) -> str | None:
    """Why ``tag`` is not a valid device tag, or None."""
    if not isinstance(tag, str) or not TAG_PATTERN.fullmatch(tag):
        return (f"tag {tag!r} must be 1-64 characters of letters, digits and _ . : + - "
                f"(starting with a letter or digit)")
    return None


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
    """``[pool]``: where the pool is and how it leases. ``PoolConfig()`` is the defaults (the default
    pool URL is the farm home's SQLite file, as with no config file)."""

    url: str = field(default_factory=lambda: default_pool_url(farm_home()))
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    acquire_timeout_s: float = DEFAULT_ACQUIRE_TIMEOUT_S
    quarantine_after: int = DEFAULT_QUARANTINE_AFTER
    liveness_s: float = DEFAULT_LIVENESS_S
    retention_days: float = DEFAULT_RETENTION_DAYS


@dataclass(frozen=True)
class DeviceConfig:
    """``[[devices]]``: what the config says about one phone (its tags, applied on every sync)."""

    serial: str
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunConfig:
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    workspace: str = DEFAULT_WORKSPACE


@dataclass(frozen=True)
class ResultsConfig:
    retention_days: float = DEFAULT_RESULTS_RETENTION_DAYS


@dataclass(frozen=True)
class FarmConfig:
    home: Path
    adb_servers: list[AdbServerAddress]
    pool: PoolConfig
    run: RunConfig = field(default_factory=RunConfig)
    source: Path | None = None
    devices: tuple[DeviceConfig, ...] = ()
    results: ResultsConfig = field(default_factory=ResultsConfig)

    @property
    def device_tags(self) -> dict[str, tuple[str, ...]]:
        """serial -> the tags the config gives it (only devices that have some)."""
        return {d.serial: d.tags for d in self.devices if d.tags}


_KNOWN = {
    "farm": {"home"},
    "adb_servers": {"host", "port"},
    "pool": {"url", "lease_ttl_s", "acquire_timeout_s", "quarantine_after", "liveness_s",
             "retention_days"},
    "run": {"command_timeout_s", "workspace"},
    "devices": {"serial", "tags"},
    "results": {"retention_days"},
}

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
_ASSIGN = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")
_PARENT = re.compile(r"(\.[^.\[\]]*|\[\d+\])$")


def _dotted(key: str) -> str:
    """``a . "b"`` -> ``a.b`` (a quoted part holding a dot stays one part, unquoted)."""
    return ".".join(part.strip("\"'") for part in re.findall(_KEY_PART, key))


def key_lines(text: str) -> dict[str, int]:
    """Where each key and table of a TOML text is: ``{"pool": 3, "pool.lease_ttl_s": 5,
    "adb_servers[1].port": 9}`` (1-based lines; the first occurrence wins). A plain line scan, good
    enough to point at a key in an error message; multi-line strings may confuse it, never break it."""
    lines: dict[str, int] = {}
    table = ""
    counts: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), 1):
        header = _HEADER.match(line)
        if header:
            name = _dotted(header.group(2))
            if header.group(1) == "[[":
                index = counts.get(name, 0)
                counts[name] = index + 1
                lines.setdefault(name, number)
                table = f"{name}[{index}]"
            else:
                table = name
            lines.setdefault(table, number)
            continue
        assign = _ASSIGN.match(line)
        if assign:
            key = _dotted(assign.group(1))
            lines.setdefault(f"{table}.{key}" if table else key, number)
    return lines


class _Where:
    """The file (and line, when the text is known) of a key, for error messages."""

    def __init__(self, where: str, text: str | None = None):
        self.where = where
        self.lines = key_lines(text) if text else {}

    def __call__(self, key: str = "") -> str:
        probe = key
        while probe:
            if probe in self.lines:
                return f"{self.where}:{self.lines[probe]}"
            # in an inline table (pool = {...}) or array (adb_servers = [...]): the enclosing key
            probe = _PARENT.sub("", probe, count=1) if _PARENT.search(probe) else ""
        return self.where


def _check_keys(table: dict, section: str, label: str, where: _Where) -> None:
    for key in table:
        if key not in _KNOWN[section]:
            raise UsageError(f"{where(f'{label}.{key}')}: unknown key '{label}.{key}' "
                             f"(known: {', '.join(sorted(_KNOWN[section]))})")


def _get(table: dict, section: str, key: str, typ: type | tuple, default: Any, where: _Where,
         positive: bool = False) -> Any:
    if key not in table:
        return default
    value = table[key]
    name = f"{section}.{key}"
    ok = isinstance(value, typ) and not isinstance(value, bool)
    if not ok:
        raise UsageError(f"{where(name)}: key '{name}' must be {_typename(typ)}, got {value!r}")
    if positive and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{where(name)}: key '{name}' must be a finite positive number, "
                         f"got {value!r}")
    return value


def _typename(typ: type | tuple) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def finite_seconds(value: float | None, flag: str, *, allow_zero: bool = False) -> float | None:
    """A duration given on the command line: finite and positive (or zero where that means "do not
    wait"); ``None`` (not given) passes. ``UsageError`` names the flag."""
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        wanted = "a finite number >= 0" if allow_zero else "a finite positive number"
        raise UsageError(f"{flag}: must be {wanted} of seconds, got {value!r}")
    return value


def default_pool_url(home: Path) -> str:
    return f"sqlite:///{home / 'pool.db'}"


def from_dict(raw: dict[str, Any], where: str = "<config>", source: Path | None = None,
              text: str | None = None) -> FarmConfig:
    """Validate a parsed config; ``text`` (the TOML source) lets errors give the key's line."""
    loc = _Where(where, text)
    for section in raw:
        if section not in _KNOWN:
            raise UsageError(f"{loc(section)}: unknown section '{section}' "
                             f"(known: {', '.join(sorted(_KNOWN))})")
    farm_t = raw.get("farm", {})
    if not isinstance(farm_t, dict):
        raise UsageError(f"{loc('farm')}: 'farm' must be a table")
    _check_keys(farm_t, "farm", "farm", loc)
    home = Path(_get(farm_t, "farm", "home", str, str(farm_home()), loc)).expanduser()

    servers_raw = raw.get("adb_servers", [{}])
    if not isinstance(servers_raw, list) or not servers_raw:
        raise UsageError(f"{loc('adb_servers')}: 'adb_servers' must be a non-empty array of tables")
    servers = []
    for i, s in enumerate(servers_raw):
        label = f"adb_servers[{i}]"
        if not isinstance(s, dict):
            raise UsageError(f"{loc(label)}: '{label}' must be a table")
        _check_keys(s, "adb_servers", label, loc)
        host = _get(s, label, "host", str, "127.0.0.1", loc)
        port = _get(s, label, "port", int, DEFAULT_ADB_PORT, loc, positive=True)
        if port > 65535:
            raise UsageError(f"{loc(label + '.port')}: key '{label}.port' must be <= 65535, "
                             f"got {port}")
        servers.append(AdbServerAddress(host, port))

    pool_t = raw.get("pool", {})
    if not isinstance(pool_t, dict):
        raise UsageError(f"{loc('pool')}: 'pool' must be a table")
    _check_keys(pool_t, "pool", "pool", loc)
    url = _get(pool_t, "pool", "url", str, default_pool_url(home), loc)
    if not url.startswith(("sqlite://", "postgresql://", "postgres://")):
        raise UsageError(f"{loc('pool.url')}: key 'pool.url' must start with sqlite:// or "
                         f"postgresql://, got {url!r}")
    pool = PoolConfig(
        url=url,
        lease_ttl_s=float(_get(pool_t, "pool", "lease_ttl_s", (int, float), DEFAULT_LEASE_TTL_S,
                               loc, True)),
        acquire_timeout_s=float(_get(pool_t, "pool", "acquire_timeout_s", (int, float),
                                     DEFAULT_ACQUIRE_TIMEOUT_S, loc, True)),
        quarantine_after=_get(pool_t, "pool", "quarantine_after", int, DEFAULT_QUARANTINE_AFTER,
                              loc, True),
        liveness_s=float(_get(pool_t, "pool", "liveness_s", (int, float), DEFAULT_LIVENESS_S, loc,
                              True)),
        retention_days=float(_get(pool_t, "pool", "retention_days", (int, float),
                                  DEFAULT_RETENTION_DAYS, loc, True)),
    )
    run_t = raw.get("run", {})
    if not isinstance(run_t, dict):
        raise UsageError(f"{loc('run')}: 'run' must be a table")
    _check_keys(run_t, "run", "run", loc)
    run = RunConfig(
        command_timeout_s=float(_get(run_t, "run", "command_timeout_s", (int, float),
                                     DEFAULT_COMMAND_TIMEOUT_S, loc, True)),
        workspace=_get(run_t, "run", "workspace", str, DEFAULT_WORKSPACE, loc),
    )
    if not run.workspace.startswith("/"):
        raise UsageError(f"{loc('run.workspace')}: key 'run.workspace' must be an absolute device "
                         f"path")
    devices = _devices(raw.get("devices", []), loc)
    results_t = raw.get("results", {})
    if not isinstance(results_t, dict):
        raise UsageError(f"{loc('results')}: 'results' must be a table")
    _check_keys(results_t, "results", "results", loc)
    results = ResultsConfig(retention_days=float(_get(
        results_t, "results", "retention_days", (int, float), DEFAULT_RESULTS_RETENTION_DAYS, loc,
        True)))
    return FarmConfig(home=home, adb_servers=servers, pool=pool, run=run, source=source,
                      devices=devices, results=results)


def _devices(raw: Any, loc: _Where) -> tuple[DeviceConfig, ...]:
    """``[[devices]]``: serial (unique) and tags of each configured phone."""
    if not isinstance(raw, list):
        raise UsageError(f"{loc('devices')}: 'devices' must be an array of tables ([[devices]])")
    devices: list[DeviceConfig] = []
    seen: dict[str, str] = {}
    for i, d in enumerate(raw):
        label = f"devices[{i}]"
        if not isinstance(d, dict):
            raise UsageError(f"{loc(label)}: '{label}' must be a table")
        _check_keys(d, "devices", label, loc)
        if "serial" not in d:
            raise UsageError(f"{loc(label)}: key '{label}.serial' is missing")
        serial = _get(d, label, "serial", str, "", loc).strip()
        if not serial:
            raise UsageError(f"{loc(label + '.serial')}: key '{label}.serial' must not be empty")
        if serial in seen:
            raise UsageError(f"{loc(label + '.serial')}: key '{label}.serial': {serial!r} is already "
                             f"configured as {seen[serial]}")
        seen[serial] = label
        tags = _get(d, label, "tags", list, [], loc)
        for tag in tags:
            problem = tag_problem(tag)
            if problem:
                raise UsageError(f"{loc(label + '.tags')}: key '{label}.tags': {problem}")
        devices.append(DeviceConfig(serial=serial, tags=tuple(sorted(set(tags)))))
    return tuple(devices)


def read_toml(path: Path, what: str = "file") -> tuple[dict[str, Any], str]:
    """A TOML file and its text; every problem is one UsageError naming the file (and the line of a
    byte that is not UTF-8). ``what`` says what the file is, in the messages."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: {what} not found") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UsageError(f"{path}:{line}: {what} is not valid UTF-8 (byte 0x{data[e.start]:02x})") \
            from None
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:
        raise UsageError(f"{path}: invalid TOML: nested too deeply") from None


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
        raw, text = read_toml(p, "config")
        return from_dict(raw, where=str(p), source=p, text=text)
    return from_dict({})
