"""The farm config: one TOML file naming adb servers, the pool URL and defaults.

Looked up in this order: an explicit path, ``$PTEFARM_CONFIG``, ``./farm.toml``. Without a file the
farm runs on its own adb server on this host and an SQLite pool under the farm home.

    [farm]
    home = "~/.ptefarm"                  # state: adb HOME, virtual devices, pool.db, export cache

    [[adb_servers]]                      # one entry per host that has phones plugged in
    host = "127.0.0.1"
    port = 15037                         # omitted: this home's own port (see home_adb_port)

    [[adb_servers]]                      # a phones' host reached over SSH (farm.device.tunnel)
    ssh = "farm@phones-3.lab"            # user@host; its adb server stays on its own loopback
    ssh_port = 22
    identity = "~/.ssh/ptefarm_ed25519"  # optional: the key (else ssh's defaults)
    known_hosts = "~/.ssh/ptefarm_known_hosts"  # optional: host keys checked against this file
    remote_port = 15037                  # its adb server's port there (default: DEFAULT_ADB_PORT)
    local_port = 25037                   # optional: this host's end (default: derived from the target)

    [pool]
    url = "sqlite:///~/.ptefarm/pool.db" # or "postgresql://user@dbhost:5432/farm"
    lease_ttl_s = 300
    acquire_timeout_s = 600
    quarantine_after = 3
    liveness_s = 120                     # lease only devices seen (synced, or used) this recently
    retention_days = 30                  # `farm pool prune`: rows of devices offline this long

    [results]                            # the results store (farm history, farm baseline)
    retention_days = 180                 # runs older than this are pruned; named baselines never

    [recovery]                           # before a device that failed is taken out of service
    rungs = ["return", "boot", "reboot"] # tried in this order; [] quarantines at once, as before
    return_timeout_s = 60                # wait for it to be listed again and answer a shell
    boot_timeout_s = 120                 # wait for sys.boot_completed
    reboot_timeout_s = 300               # adb reboot, then wait for it to come back booted
    probe_timeout_s = 10                 # one look: listed, a shell echoes, sys.boot_completed is 1

    [virtual]                            # virtual devices this farm starts (farm virtual up, --virtual)
    timing = "host"                      # or "phone": a simulated phone's timing, marked simulated

    [[devices]]                          # optional, per phone: tags the pool matches requests on
    serial = "R5CW1234ABC"
    tags = ["flagship", "usb3"]

    [run]
    command_timeout_s = 600
    help_timeout_s = 60                  # a runner's --help, asked once after deploy for its dialect
    workspace = "/data/local/tmp/ptefarm"

Every key is validated at start-up; an error names the file, the line where the key is (when the
file has it) and the key: ``farm.toml:7: key 'pool.lease_ttl_s' must be a finite positive number``.
Numbers must be finite and positive (TOML allows ``inf`` and ``nan``; the farm does not). Strings are
bounded (a path's length, a host name's) and an error quotes a short excerpt of a bad one, never all of
it; the file itself is at most ``MAX_CONFIG_BYTES``.

Each farm home has its own adb server: a local ``[[adb_servers]]`` entry without a ``port`` (and the
default with no entry at all) is the port recorded in the home's ``adb-port`` file, chosen free on
first use and kept afterwards, so that two homes on one host never see (or stop) each other's
devices. A ``port`` written in the config is used as it is: a shared server, for instance the one
that owns the host's USB phones (only one adb server can hold a phone). A remote entry without a
``port`` is ``DEFAULT_ADB_PORT``, where a farm host's shared server listens (``adb -a -P 15037``).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from farm.errors import UsageError
from farm.fileio import write_atomic

DEFAULT_ADB_PORT = 15037  # a farm host's shared adb server (configured), never the user's 5037
ADB_PORT_FILE = "adb-port"  # in the farm home: the port of the home's own adb server
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# Where a home's own port is picked: above the ports services and adb's emulators use, below the
# kernel's ephemeral range (an outgoing connection could hold a port from there when the server
# restarts). Narrowed to what the host's ip_local_port_range leaves free.
HOME_PORT_RANGE = (16000, 32767)
MAX_CONFIG_BYTES = 1 << 20  # a farm config is a few hundred bytes; more is a mistake, never read whole
MAX_PATH_CHARS = 4096  # PATH_MAX: a home, a workspace, a pool URL (an SQLite file's path)
MAX_HOST_CHARS = 253   # a DNS name
MAX_SERIAL_CHARS = 256
EXCERPT_CHARS = 60     # of a bad value, in an error message
DEFAULT_WORKSPACE = "/data/local/tmp/ptefarm"
# The defaults of [pool] and [run], here and nowhere else (the pool and the sessions take the
# config's dataclasses, never numbers of their own).
DEFAULT_LEASE_TTL_S = 300.0
DEFAULT_ACQUIRE_TIMEOUT_S = 600.0
DEFAULT_QUARANTINE_AFTER = 3
DEFAULT_LIVENESS_S = 120.0  # a device not seen (synced, or used) this long is not leased
DEFAULT_COMMAND_TIMEOUT_S = 600.0
DEFAULT_HELP_TIMEOUT_S = 60.0
DEFAULT_RETENTION_DAYS = 30.0
DEFAULT_RESULTS_RETENTION_DAYS = 180.0  # stored runs; named baselines are kept whatever their age
# The recovery ladder (farm.device.recovery): its rungs in the only order they make sense in, and how
# long each may take. The waits are Tradefed's order of magnitude (a phone reboots in 30-90 s).
RECOVERY_RUNGS = ("return", "boot", "reboot")
DEFAULT_RETURN_TIMEOUT_S = 60.0
DEFAULT_BOOT_TIMEOUT_S = 120.0
DEFAULT_REBOOT_TIMEOUT_S = 300.0
DEFAULT_PROBE_TIMEOUT_S = 10.0  # one look's shell: a phone that cannot echo in 10 s is not answering
# A device tag: what `farm pool tag` and `[[devices]] tags` accept (no spaces or commas: tags are
# listed comma-separated).
TAG_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}")


def tag_problem(tag: object) -> str | None:
    """Why ``tag`` is not a valid device tag, or None."""
    if not isinstance(tag, str) or not TAG_PATTERN.fullmatch(tag):
        return (f"tag {excerpt(tag)} must be 1-64 characters of letters, digits and _ . : + - "
                f"(starting with a letter or digit)")
    return None


def farm_home() -> Path:
    return Path(os.environ.get("PTEFARM_HOME", "~/.ptefarm")).expanduser()


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters and saying so: a bad
    value of any size is quoted in a line (the repr of a 50 MB string is never built)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... (cut: {len(value)} characters in all)"
    if isinstance(value, (list, dict)) and len(value) > 8:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    if len(text) <= limit + 2:
        return text
    return f"{text[:limit]}... (cut: {len(text)} characters in all)"


def _key_name(name: str) -> str:
    """A key or table name as an error shows it: unquoted, cut when long."""
    return name if len(name) <= EXCERPT_CHARS else f"{name[:EXCERPT_CHARS]}... (cut)"


def home_adb_port(home: Path) -> int:
    """The port of this farm home's own adb server: read from ``<home>/adb-port``, or chosen free
    and recorded there on first use (kept afterwards: the server, ``farm adb`` and the pool's device
    rows agree on it). Two processes of one home racing here agree on the first one recorded."""
    path = Path(home) / ADB_PORT_FILE
    port = _read_port(path)
    if port is not None:
        return port
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        candidate = path.with_name(f".{ADB_PORT_FILE}.{os.getpid()}.tmp")
        write_atomic(candidate, f"{_free_home_port()}\n")
        try:
            os.link(candidate, path)  # never replaces: a port another process recorded wins
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(OSError):
                candidate.unlink()
    except OSError as e:
        raise UsageError(f"{path}: cannot record the farm home's adb server port: "
                         f"{e.strerror or e} (or name one: [[adb_servers]] port in the config)") \
            from None
    port = _read_port(path)
    if port is None:
        raise UsageError(f"{path}: the farm home's adb server port vanished while recording it")
    return port


def _read_port(path: Path) -> int | None:
    try:
        text = path.read_text(errors="replace")[:16].strip()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UsageError(f"{path}: cannot read the farm home's adb server port: "
                         f"{e.strerror or e}") from None
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UsageError(f"{path}: not an adb server port ({excerpt(text)}); delete the file "
                         f"to have a free port chosen")
    return int(text)


def _free_home_port() -> int:
    """A port nothing listens on now, from HOME_PORT_RANGE (outside the ephemeral range)."""
    low, high = HOME_PORT_RANGE
    with contextlib.suppress(OSError, ValueError):
        first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        if first_ephemeral - 1 > low + 1000:
            high = min(high, first_ephemeral - 1)
    for port in random.sample(range(low, high + 1), 64):
        if _bindable(port):
            return port
    with socket.socket() as s:  # a crowded host: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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
            raise UsageError(f"adb server {excerpt(text)}: expected HOST:PORT")
        return cls(host, int(port))


@dataclass(frozen=True)
class SshTunnelConfig:
    """An ``[[adb_servers]]`` entry with ``ssh``: that host's adb server, reached through an OpenSSH
    local forward on 127.0.0.1:``local_port`` (farm.device.tunnel)."""

    target: str  # user@host
    local_port: int
    remote_port: int = 15037
    remote_host: str = "127.0.0.1"
    ssh_port: int = 22
    identity: str | None = None
    known_hosts: str | None = None


SSH_TARGET = re.compile(r"(?:[A-Za-z0-9._][A-Za-z0-9._-]{0,63}@)?[A-Za-z0-9][A-Za-z0-9.-]{0,252}")
TUNNEL_PORTS = (20000, 40000)  # where derived local ports fall: above the farm homes' own


def tunnel_local_port(target: str, ssh_port: int, remote_port: int) -> int:
    """The local end of a forward to ``target``'s adb server: the same on every host and in every
    process, so the pool names the server one way (``127.0.0.1:<port>``)."""
    import hashlib

    low, high = TUNNEL_PORTS
    digest = hashlib.sha256(f"{target}|{ssh_port}|{remote_port}".encode()).digest()
    return low + int.from_bytes(digest[:4], "big") % (high - low)


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
    # A runner that does not answer --help within this is one that cannot start (bad input); a hung
    # one costs each run that long once, so a test of that path sets it short.
    help_timeout_s: float = DEFAULT_HELP_TIMEOUT_S
    workspace: str = DEFAULT_WORKSPACE


@dataclass(frozen=True)
class RecoveryConfig:
    """``[recovery]``: the rungs of the recovery ladder a device that failed for infrastructure reasons
    climbs before it is taken out of service, and how long each may take."""

    rungs: tuple[str, ...] = RECOVERY_RUNGS
    return_timeout_s: float = DEFAULT_RETURN_TIMEOUT_S
    boot_timeout_s: float = DEFAULT_BOOT_TIMEOUT_S
    reboot_timeout_s: float = DEFAULT_REBOOT_TIMEOUT_S
    probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S

    def __post_init__(self) -> None:
        rungs = tuple(self.rungs)
        object.__setattr__(self, "rungs", rungs)
        if unknown := [r for r in rungs if r not in RECOVERY_RUNGS]:
            raise UsageError(f"recovery rung(s) {', '.join(map(repr, unknown))}: known rungs are "
                             f"{', '.join(RECOVERY_RUNGS)}")
        if list(rungs) != sorted(set(rungs), key=RECOVERY_RUNGS.index):
            raise UsageError(f"recovery rungs {list(rungs)}: each at most once, in the order "
                             f"{', '.join(RECOVERY_RUNGS)} (a reboot before waiting for a boot "
                             f"would cut the boot short)")


VIRTUAL_TIMINGS = ("host", "phone")


@dataclass(frozen=True)
class VirtualConfig:
    """``[virtual]``: how virtual devices this farm starts behave. ``timing = "phone"``: their runner
    reports a simulated phone's timing (farm/runner/timing.py), every figure marked simulated."""

    timing: str = "host"


DEFAULT_CHUNK_MIN_BYTES = 16 << 20
DEFAULT_CHUNK_STORE_BYTES = 8 << 30


@dataclass(frozen=True)
class DeployConfig:
    """``[deploy]``: chunked deploy (farm/execute/chunking.py). ``chunk_min_bytes``: files of this
    size and more go as content-defined chunks (None, ``"off"`` in the file: none do);
    ``chunk_store_bytes``: the bound of each device's chunk store. ``PTEFARM_CHUNK_MIN_BYTES``
    overrides the first (CI, tests)."""

    chunk_min_bytes: int | None = DEFAULT_CHUNK_MIN_BYTES
    chunk_store_bytes: int = DEFAULT_CHUNK_STORE_BYTES


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
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    virtual: VirtualConfig = field(default_factory=VirtualConfig)
    deploy: DeployConfig = field(default_factory=DeployConfig)
    tunnels: tuple[SshTunnelConfig, ...] = ()  # the ssh entries of adb_servers, in order

    @property
    def device_tags(self) -> dict[str, tuple[str, ...]]:
        """serial -> the tags the config gives it (only devices that have some)."""
        return {d.serial: d.tags for d in self.devices if d.tags}


_KNOWN = {
    "farm": {"home"},
    "adb_servers": {"host", "port", "ssh", "ssh_port", "identity", "known_hosts", "remote_port",
                    "local_port"},
    "pool": {"url", "lease_ttl_s", "acquire_timeout_s", "quarantine_after", "liveness_s",
             "retention_days"},
    "run": {"command_timeout_s", "help_timeout_s", "workspace"},
    "devices": {"serial", "tags"},
    "results": {"retention_days"},
    "virtual": {"timing"},
    "deploy": {"chunk_min_bytes", "chunk_store_bytes"},
    "recovery": {"rungs", "return_timeout_s", "boot_timeout_s", "reboot_timeout_s", "probe_timeout_s"},
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
            raise UsageError(f"{where(f'{label}.{key}')}: unknown key '{label}.{_key_name(key)}' "
                             f"(known: {', '.join(sorted(_KNOWN[section]))})")


def _get(table: dict, section: str, key: str, typ: type | tuple, default: Any, where: _Where,
         positive: bool = False, max_chars: int = MAX_PATH_CHARS) -> Any:
    """``table[key]`` checked: its type, a number finite and positive, a string at most
    ``max_chars`` long; errors quote an excerpt of the value."""
    if key not in table:
        return default
    value = table[key]
    name = f"{section}.{key}"
    ok = isinstance(value, typ) and not isinstance(value, bool)
    if not ok:
        raise UsageError(f"{where(name)}: key '{name}' must be {_typename(typ)}, "
                         f"got {excerpt(value)}")
    if positive and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{where(name)}: key '{name}' must be a finite positive number, "
                         f"got {excerpt(value)}")
    if isinstance(value, str) and len(value) > max_chars:
        raise UsageError(f"{where(name)}: key '{name}' is too long (at most {max_chars} "
                         f"characters): {excerpt(value)}")
    return value


def _tunnel(s: dict, label: str, loc: _Where) -> SshTunnelConfig:
    if "host" in s or "port" in s:
        key = "host" if "host" in s else "port"
        raise UsageError(f"{loc(label + '.' + key)}: key '{label}.{key}' with '{label}.ssh': the "
                         f"server is reached through the forward on this host (remote_port, local_port)")
    target = _get(s, label, "ssh", str, "", loc, max_chars=MAX_HOST_CHARS)
    if not SSH_TARGET.fullmatch(target):
        raise UsageError(f"{loc(label + '.ssh')}: key '{label}.ssh' must be user@host or host "
                         f"(letters, digits, . _ -), got {excerpt(target)}")
    ports = {}
    for key, default in (("ssh_port", 22), ("remote_port", DEFAULT_ADB_PORT), ("local_port", None)):
        value = _get(s, label, key, int, default, loc, positive=True)
        if value is not None and value > 65535:
            raise UsageError(f"{loc(label + '.' + key)}: key '{label}.{key}' must be <= 65535, got {value}")
        ports[key] = value
    paths = {}
    for key in ("identity", "known_hosts"):
        value = _get(s, label, key, str, None, loc)
        paths[key] = None if value is None else str(Path(value).expanduser())
    local = ports["local_port"] or tunnel_local_port(target, ports["ssh_port"], ports["remote_port"])
    return SshTunnelConfig(target=target, local_port=local, remote_port=ports["remote_port"],
                           ssh_port=ports["ssh_port"], identity=paths["identity"],
                           known_hosts=paths["known_hosts"])


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


def _url_host_problem(url: str) -> str | None:
    """Why a PostgreSQL URL's host cannot be a host name (a label over 63 characters, a name over
    253), before a driver trips over it."""
    if url.startswith("sqlite://"):
        return None
    try:
        host = urlsplit(url).hostname or ""
    except ValueError as e:
        return f"not a URL ({e})"
    if host.startswith("[") or ":" in host:
        return None  # an IPv6 address
    if len(host) > MAX_HOST_CHARS or any(len(label) > 63 for label in host.split(".")):
        return f"host {excerpt(host)} is not a host name (labels of at most 63 characters)"
    return None


def default_pool_url(home: Path) -> str:
    return f"sqlite:///{home / 'pool.db'}"


def from_dict(raw: dict[str, Any], where: str = "<config>", source: Path | None = None,
              text: str | None = None) -> FarmConfig:
    """Validate a parsed config; ``text`` (the TOML source) lets errors give the key's line."""
    loc = _Where(where, text)
    for section in raw:
        if section not in _KNOWN:
            raise UsageError(f"{loc(section)}: unknown section '{_key_name(section)}' "
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
    tunnels: list[SshTunnelConfig] = []
    for i, s in enumerate(servers_raw):
        label = f"adb_servers[{i}]"
        if not isinstance(s, dict):
            raise UsageError(f"{loc(label)}: '{label}' must be a table")
        _check_keys(s, "adb_servers", label, loc)
        if "ssh" in s:
            tunnel = _tunnel(s, label, loc)
            tunnels.append(tunnel)
            servers.append(AdbServerAddress("127.0.0.1", tunnel.local_port))
            continue
        for key in ("ssh_port", "identity", "known_hosts", "remote_port", "local_port"):
            if key in s:
                raise UsageError(f"{loc(label + '.' + key)}: key '{label}.{key}' is for an entry "
                                 f"reached over SSH: give '{label}.ssh' (user@host)")
        host = _get(s, label, "host", str, "127.0.0.1", loc, max_chars=MAX_HOST_CHARS)
        if "port" in s or host not in LOCAL_HOSTS:
            port = _get(s, label, "port", int, DEFAULT_ADB_PORT, loc, positive=True)
        else:  # this host's server, port not named: the home's own (isolated from other homes)
            port = home_adb_port(home)
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
                         f"postgresql://, got {excerpt(url)}")
    host_problem = _url_host_problem(url)
    if host_problem:
        raise UsageError(f"{loc('pool.url')}: key 'pool.url': {host_problem}")
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
        help_timeout_s=float(_get(run_t, "run", "help_timeout_s", (int, float),
                                  DEFAULT_HELP_TIMEOUT_S, loc, True)),
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
    locals_ = [a.port for a in servers]
    if len(set(locals_)) != len(locals_):
        raise UsageError(f"{loc('adb_servers')}: two adb_servers entries end on one port of this host "
                         f"({', '.join(str(p) for p in sorted(locals_) if locals_.count(p) > 1)}): give "
                         f"each ssh entry its own local_port")
    return FarmConfig(home=home, adb_servers=servers, tunnels=tuple(tunnels), pool=pool, run=run, source=source,
                      devices=devices, results=results, recovery=_recovery(raw.get("recovery", {}), loc),
                      virtual=_virtual(raw.get("virtual", {}), loc), deploy=_deploy(raw.get("deploy", {}), loc))


def _deploy(table: Any, loc: _Where) -> DeployConfig:
    if not isinstance(table, dict):
        raise UsageError(f"{loc('deploy')}: 'deploy' must be a table")
    _check_keys(table, "deploy", "deploy", loc)
    min_bytes = table.get("chunk_min_bytes", DEFAULT_CHUNK_MIN_BYTES)
    if min_bytes == "off":
        min_bytes = None
    elif isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
        raise UsageError(f"{loc('deploy.chunk_min_bytes')}: key 'deploy.chunk_min_bytes' must be a "
                         f"size in bytes or \"off\", got {excerpt(min_bytes)}")
    store = _get(table, "deploy", "chunk_store_bytes", int, DEFAULT_CHUNK_STORE_BYTES, loc, True)
    return DeployConfig(chunk_min_bytes=min_bytes, chunk_store_bytes=store)


def _recovery(table: Any, loc: _Where) -> RecoveryConfig:
    if not isinstance(table, dict):
        raise UsageError(f"{loc('recovery')}: 'recovery' must be a table")
    _check_keys(table, "recovery", "recovery", loc)
    rungs = _get(table, "recovery", "rungs", list, list(RECOVERY_RUNGS), loc)
    if not all(isinstance(r, str) for r in rungs):
        raise UsageError(f"{loc('recovery.rungs')}: key 'recovery.rungs' must be a list of rung names "
                         f"({', '.join(RECOVERY_RUNGS)}), got {excerpt(rungs)}")
    seconds = {key: float(_get(table, "recovery", key, (int, float), default, loc, True))
               for key, default in (("return_timeout_s", DEFAULT_RETURN_TIMEOUT_S),
                                    ("boot_timeout_s", DEFAULT_BOOT_TIMEOUT_S),
                                    ("reboot_timeout_s", DEFAULT_REBOOT_TIMEOUT_S),
                                    ("probe_timeout_s", DEFAULT_PROBE_TIMEOUT_S))}
    try:
        return RecoveryConfig(rungs=tuple(rungs), **seconds)
    except UsageError as e:
        raise UsageError(f"{loc('recovery.rungs')}: key 'recovery.rungs': {e}") from None


def _virtual(table: Any, loc: _Where) -> VirtualConfig:
    if not isinstance(table, dict):
        raise UsageError(f"{loc('virtual')}: 'virtual' must be a table")
    _check_keys(table, "virtual", "virtual", loc)
    timing = _get(table, "virtual", "timing", str, "host", loc)
    if timing not in VIRTUAL_TIMINGS:
        raise UsageError(f"{loc('virtual.timing')}: key 'virtual.timing' must be one of "
                         f"{', '.join(VIRTUAL_TIMINGS)}, got {excerpt(timing)}")
    return VirtualConfig(timing=timing)


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
        serial = _get(d, label, "serial", str, "", loc, max_chars=MAX_SERIAL_CHARS).strip()
        if not serial:
            raise UsageError(f"{loc(label + '.serial')}: key '{label}.serial' must not be empty")
        if serial in seen:
            raise UsageError(f"{loc(label + '.serial')}: key '{label}.serial': {excerpt(serial)} is "
                             f"already configured as {seen[serial]}")
        seen[serial] = label
        tags = _get(d, label, "tags", list, [], loc)
        for tag in tags:
            problem = tag_problem(tag)
            if problem:
                raise UsageError(f"{loc(label + '.tags')}: key '{label}.tags': {problem}")
        devices.append(DeviceConfig(serial=serial, tags=tuple(sorted(set(tags)))))
    return tuple(devices)


def read_text(path: Path, what: str = "file", max_bytes: int | None = MAX_CONFIG_BYTES, *,
              bad_byte_at: Literal["line", "offset"] = "line") -> str:
    """The text of an input file, UTF-8; every problem is one UsageError naming the file. ``what``
    says what the file is, in the messages. A file over ``max_bytes`` is refused unread (never held,
    parsed or echoed whole; None: no bound). A byte that is not UTF-8 is named with its line
    (``path:LINE:``), or with ``bad_byte_at="offset"`` its offset in the file (a JSON file, whose
    parser counts characters, not lines)."""
    try:
        with open(path, "rb") as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:
            raise UsageError(f"{path}: {what} is larger than {max_bytes} bytes; not read")
    except FileNotFoundError:
        raise UsageError(f"{path}: {what} not found") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        byte = f"byte 0x{data[e.start]:02x}"
        if bad_byte_at == "offset":
            raise UsageError(f"{path}: {what} is not valid UTF-8 ({byte} at offset {e.start})") from None
        line = data[:e.start].count(b"\n") + 1
        raise UsageError(f"{path}:{line}: {what} is not valid UTF-8 ({byte})") from None


def read_toml(path: Path, what: str = "file",
              max_bytes: int = MAX_CONFIG_BYTES) -> tuple[dict[str, Any], str]:
    """A TOML file and its text, read by ``read_text``; every problem is one UsageError naming the
    file (and the line of a byte that is not UTF-8)."""
    text = read_text(path, what, max_bytes)
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
