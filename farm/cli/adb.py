"""``farm adb ARGS...``: the adb binary bundled in adbutils, pointed at the farm's adb server.

Nobody needs adb on PATH nor has to remember the farm's port: ``farm adb devices -l``, ``farm adb -s
SERIAL shell getprop ro.soc.model`` and ``farm adb -s SERIAL push f /data/local/tmp/x`` pass their
arguments to adb unchanged, and exit with adb's exit code (the process *becomes* adb: signals, the
terminal of an interactive ``adb shell`` and the exit status are adb's own).

The server is the config's first ``[[adb_servers]]`` entry, or ``--server HOST:PORT``; under ``farm
pool exec`` the leased device's server (``$ADB_SERVER_SOCKET``) when the config names it. adb reads
the server from ``ANDROID_ADB_SERVER_PORT`` (and ``ANDROID_ADB_SERVER_ADDRESS`` for another host);
adb's own ``-H``/``-P``/``-L`` still win. ``HOME`` and ``TMPDIR`` are the server's private ones
(``<farm home>/adb-home/<port>``), so that a server adb starts by itself (none answering on a local
port) gets the farm's keys and log, never ``~/.android``.

``farm adb --print-env`` prints the same settings as ``export`` lines for scripts that call ``adb``
themselves (upstream's SimpleADB): ``eval "$(farm adb --print-env)"; adb devices``.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from farm.cli.options import config_option, farm_config
from farm.config import AdbServerAddress, FarmConfig
from farm.errors import UsageError

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# What would point adb at another server than the one chosen here (adb prefers ADB_SERVER_SOCKET).
_SERVER_ENV = ("ADB_SERVER_SOCKET", "ANDROID_ADB_SERVER_ADDRESS", "ANDROID_ADB_SERVER_PORT")


def _from_socket_env(config: FarmConfig) -> AdbServerAddress | None:
    """The server ``farm pool exec`` exported (``tcp:HOST:PORT``), when the config knows it."""
    spec = os.environ.get("ADB_SERVER_SOCKET", "")
    if not spec.startswith("tcp:"):
        return None
    try:
        wanted = AdbServerAddress.parse(spec.removeprefix("tcp:"))
    except UsageError:
        return None
    return wanted if wanted in config.adb_servers else None


def pick_server(config: FarmConfig, server: str | None) -> AdbServerAddress:
    if server is not None:
        return AdbServerAddress.parse(server)  # a UsageError names the --server value
    if not config.adb_servers:
        where = config.source or "the built-in defaults"
        raise UsageError(f"{where}: no [[adb_servers]] configured: nothing for adb to talk to")
    return _from_socket_env(config) or config.adb_servers[0]


def adb_home(config: FarmConfig, server: AdbServerAddress) -> Path:
    """The private HOME of the farm's server on ``server.port`` (as VirtualFarm and AdbServer use)."""
    return config.home / "adb-home" / str(server.port)


def adb_env(config: FarmConfig, server: AdbServerAddress) -> dict[str, str]:
    """The variables that make the bundled adb client use ``server`` (and, should it have to start a
    local server, start it like the farm does: private HOME, no mDNS, no libusb scan)."""
    home = adb_home(config, server)
    env = {"ANDROID_ADB_SERVER_PORT": str(server.port), "HOME": str(home), "TMPDIR": str(home),
           "ADB_MDNS": "0", "ADB_LIBUSB": "0"}
    if server.host not in LOCAL_HOSTS:
        env["ANDROID_ADB_SERVER_ADDRESS"] = server.host
    return env


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SERVER_ENV}
    env.update(extra)
    return env


@click.command("adb", context_settings={"ignore_unknown_options": True,
                                        "allow_interspersed_args": False})
@click.option("--server", default=None, metavar="HOST:PORT",
              help="adb server [default: $ADB_SERVER_SOCKET when it names a configured server (as "
                   "under 'farm pool exec'), else the config's first adb_servers entry].")
@click.option("--print-env", is_flag=True,
              help="Print 'export' lines (PATH with the bundled adb first, the server's port) for "
                   "scripts, instead of running adb.")
@config_option
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def adb(server: str | None, print_env: bool, args: tuple[str, ...]) -> None:
    """Run the bundled adb against the farm's adb server; ARGS go to adb unchanged.

    \b
    Examples:
      farm adb devices -l
      farm adb -s 127.0.0.1:40123 shell getprop ro.soc.model
      eval "$(farm adb --print-env)"; adb devices

    farm's own options (--server, --print-env, --config) come before ARGS; everything from the
    first adb argument on is adb's (farm adb help: adb's help). Exits with adb's exit code."""
    from farm.device.adb_server import adb_binary

    config = farm_config()
    chosen = pick_server(config, server)
    binary = adb_binary()
    extra = adb_env(config, chosen)
    if print_env:
        if args:
            raise UsageError(f"--print-env takes no adb arguments (got {shlex.join(args)})")
        bindir = os.path.dirname(binary)
        click.echo(f"export PATH={shlex.quote(bindir)}:\"$PATH\"")
        click.echo(f"export ADB={shlex.quote(binary)}")
        click.echo(f"export ANDROID_ADB_SERVER_PORT={chosen.port}")
        if "ANDROID_ADB_SERVER_ADDRESS" in extra:
            click.echo(f"export ANDROID_ADB_SERVER_ADDRESS={shlex.quote(chosen.host)}")
        # A socket exported by 'farm pool exec' would win over the port: keep adb on this server.
        click.echo("unset ADB_SERVER_SOCKET")
        return
    if not args:
        raise UsageError("farm adb: give adb arguments, e.g. 'farm adb devices -l' "
                         "('farm adb help' for adb's own help)")
    # A server reached over SSH: its forward up first, or adb would start a server of its own on the
    # forward's port. Ours is tied to this pid, which adb keeps: it ends when adb does.
    if config.tunnels:
        from farm.session import open_tunnel_for

        open_tunnel_for(config, str(chosen))
    sys.stdout.flush()
    sys.stderr.flush()
    os.makedirs(extra["HOME"], exist_ok=True)  # adb writes its keys and log there
    try:
        os.execve(binary, [binary, *args], _child_env(extra))
    except OSError as e:
        raise UsageError(f"cannot run the bundled adb {binary}: {e.strerror or e}") from None
