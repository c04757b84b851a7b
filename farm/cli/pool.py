"""``farm pool ...``: the shared device pool from the shell and from CI jobs.

    farm pool exec --soc SM8650 --priority pr -- ./device-step.sh   # lease, heartbeat, run, release
    TOKEN=$(farm pool lease --soc SM8650 --ttl 3600 --priority pr)
    eval "$(farm pool lease --soc SM8650 --format env)"   # export PTEFARM_LEASE, ANDROID_SERIAL, ...
    farm pool release "$TOKEN"

A lease taken with ``farm pool lease`` has no heartbeat (the command exits): it lives for its TTL unless
renewed with ``farm pool renew``; pick a TTL that covers the job, and release when done. ``farm pool
exec`` holds its lease with a heartbeat for as long as its command runs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import click
from rich.table import Table

from farm.cli.options import config_option, farm_config, json_option, pool_url_option
from farm.cli.progress import LeaseWaitReporter, console
from farm.config import FarmConfig, finite_seconds
from farm.db.base import PoolLost
from farm.errors import AdbError, LeaseError, LeaseLost, PoolError, UsageError
from farm.exitcodes import ExitCode
from farm.pool import Event, Holder, Lease, LeaseRequest, Pool, PoolStatus
from farm.pool.hold import hold
from farm.session import open_tunnel_for
from farm.vocab import EventKind

T = TypeVar("T")

# What `farm pool sync` reports, from the events the sync wrote: (label, event kind).
SYNC_CHANGES = (("added", EventKind.ADDED), ("back online", EventKind.ONLINE),
                ("offline", EventKind.OFFLINE), ("updated", EventKind.UPDATED))
EXEC_KILL_GRACE_S = 10.0  # `farm pool exec`: SIGKILL a command still running this long after a signal
EXEC_POLL_S = 0.2  # how often it checks its lease while the command runs


def _seconds(flag: str, *, allow_zero: bool = False):
    """A click callback: the flag's value must be a finite positive number (UsageError, one line)."""
    return lambda ctx, param, value: finite_seconds(value, flag, allow_zero=allow_zero)


def pool_options(f):
    """``--config`` and ``--url``, accepted on ``farm pool`` and after each of its sub-commands."""
    return config_option(pool_url_option(f))


def _open(config: FarmConfig | None = None) -> Pool:
    return Pool.from_config(config or farm_config())


def _with_pool(call: Callable[[Pool], T]) -> T:
    """``call`` on the configured pool, closed afterwards."""
    with _open() as p:
        return call(p)


def _acquire(config: FarmConfig, pool: Pool, request: LeaseRequest, holder: Holder,
             ttl: float | None, timeout: float | None) -> Lease:
    """``pool.acquire`` (after a cheap liveness pass over the configured adb servers: see
    farm.session) that says on stderr whom it waits for (a live line at a terminal)."""
    from farm.session import refresh_configured

    reporter = LeaseWaitReporter(pool.status, request)
    try:
        refresh_configured(config, pool)
        return pool.acquire(request, holder, ttl_s=ttl, timeout_s=timeout, on_wait=reporter)
    finally:
        reporter.done()


@click.group("pool")
@pool_options
def pool() -> None:
    """The shared device pool: leases, queue, health."""


def pool_command(f):
    """A ``farm pool`` sub-command; it takes ``--config`` and ``--url`` after its name too."""
    return pool.command()(pool_options(f))


@pool_command
def sync() -> None:
    """Discover devices on the configured adb servers into the pool.

    A server that does not answer is reported and its devices go offline; the others are synced
    all the same (exit code 3 when any server did not answer)."""
    from farm.session import open_farm  # adb only here: the pool library does not need it

    config = farm_config()
    with _open(config) as p:
        last = p.history(limit=1)
    with open_farm(config) as farm:  # discovers every server and syncs the pool once
        events = farm.pool.history(after_id=last[-1].id if last else 0, limit=None)
        status = farm.pool.status()
        unreachable = list(farm.unreachable)
    servers = {str(s) for s in config.adb_servers}
    ours = {d.device.serial: d.device for d in status.devices if d.device.server in servers}
    for label, kind in SYNC_CHANGES:
        serials = dict.fromkeys(e.serial for e in events if e.kind == kind and e.serial in ours)
        if serials:
            click.echo(f"{label}: {', '.join(serials)}")
    present = sum(1 for d in ours.values() if d.present)
    click.echo(f"{present} device(s) present on {len(servers) - len(unreachable)} of {len(servers)} "
               f"adb server(s)")
    if unreachable:
        raise AdbError("; ".join(unreachable))


def _age(seconds: float) -> str:
    whole = round(seconds)
    if abs(whole) < 120:
        return f"{whole}s"
    if abs(whole) < 7200:
        return f"{whole // 60}m"
    return f"{whole // 3600}h"


def _status_tables(status: PoolStatus) -> list[Table]:
    devices = Table(title="devices")
    for col in ("serial", "server", "soc", "htp", "tags", "state", "seen", "holder", "expires in",
                "fails", "reason"):
        devices.add_column(col)
    for d in status.devices:
        dev, lease = d.device, d.lease
        seen = f"{_age(status.now - dev.last_seen)} ago" if dev.last_seen is not None else "never"
        devices.add_row(dev.serial, dev.server, dev.soc or "?", dev.htp_arch or "?",
                        ",".join(dev.tags), dev.state, seen,
                        lease.holder.describe() if lease else "",
                        _age(lease.expires - status.now) if lease else "",
                        str(dev.infra_failures) if dev.infra_failures else "", dev.reason)
    tables = [devices]
    if status.queue:
        queue = Table(title="queue (served top first)")
        for col in ("id", "priority", "request", "holder", "waiting"):
            queue.add_column(col)
        for q in status.queue:
            queue.add_row(str(q.id), str(q.request.priority), q.request.describe(),
                          q.holder.describe(), _age(status.now - q.enqueued))
        tables.append(queue)
    return tables


@pool_command
@json_option
def status(as_json: bool) -> None:
    """Devices, their states and holders, and the wait queue."""
    st = _with_pool(Pool.status)
    if as_json:
        click.echo(json.dumps(st.to_dict(), indent=2))
        return
    out = console()  # not a terminal (CI logs, pipes): whole lines, never cut at 80 columns
    if not st.devices:
        click.echo("the pool has no devices: run 'farm pool sync'")
    for table in _status_tables(st):
        out.print(table)


def request_options(f):
    """What to lease, for how long and how long to wait: the options of ``lease`` and ``exec``."""
    for option in reversed((
        click.option("--soc", "socs", multiple=True, help="Acceptable SoC (repeatable), e.g. SM8650."),
        click.option("--min-htp", default=None, help="Minimum HTP arch, e.g. v73."),
        click.option("--tag", "tags", multiple=True, help="Required device tag (repeatable)."),
        click.option("--serial", default=None, help="This device and no other."),
        click.option("--virtual/--physical", "virtual", default=None,
                     help="Only virtual / physical devices."),
        click.option("--priority", default="adhoc", show_default=True,
                     help="release, nightly, pr, adhoc, or an integer; higher is served first."),
        click.option("--ttl", type=float, default=None, callback=_seconds("--ttl"),
                     help="Lease TTL in seconds (default: config)."),
        click.option("--timeout", type=float, default=None,
                     callback=_seconds("--timeout", allow_zero=True),
                     help="Wait at most this long, 0: do not wait (default: config)."),
        click.option("--purpose", default="", help="Shown to others in status and timeout errors."),
    )):
        f = option(f)
    return f


def lease_env(token: str, serial: str, server: str) -> dict[str, str]:
    """The environment of a leased device for tools that speak adb themselves (adb, adbutils, farm):
    the device, its adb server ("host:port") and the lease token that ``farm deploy``/``farm run`` need."""
    host, _, port = server.rpartition(":")
    return {"PTEFARM_LEASE": token, "ANDROID_SERIAL": serial, "ADB_SERVER_SOCKET": f"tcp:{server}",
            "ANDROID_ADB_SERVER_HOST": host, "ANDROID_ADB_SERVER_PORT": port}


def with_farm_adb(path: str) -> str:
    """``path`` with the farm's bundled adb first: upstream's scripts (SimpleADB) run plain ``adb``,
    which must be a client that speaks to the farm's server (reached through the exported
    ADB_SERVER_SOCKET / ANDROID_ADB_SERVER_PORT: SimpleADB takes no port)."""
    from farm.device.adb_server import adb_binary

    bindir = os.path.dirname(adb_binary())
    return os.pathsep.join([bindir, *(p for p in path.split(os.pathsep) if p and p != bindir)])


def _leased_line(lease: Lease) -> str:
    dev = lease.device
    what = ", ".join(x for x in (dev.soc, dev.htp_arch, "virtual" if dev.virtual else "") if x)
    return f"leased {lease.serial} ({what}) on adb server {lease.server} for {lease.ttl_s:g}s"


@pool_command
@request_options
@click.option("--format", "fmt", type=click.Choice(["token", "env", "json"]), default="token",
              show_default=True,
              help="token: the token alone on stdout (the serial on stderr); env: export lines; json.")
def lease(socs: tuple[str, ...], min_htp: str | None, tags: tuple[str, ...],
          serial: str | None, virtual: bool | None, priority: str, ttl: float | None,
          timeout: float | None, purpose: str, fmt: str) -> None:
    """Lease a device and print its token (no heartbeat: renew or release it yourself).

    TOKEN=$(farm pool lease --soc SM8650) keeps the token; eval "$(farm pool lease --soc SM8650
    --format env)" exports PTEFARM_LEASE, ANDROID_SERIAL, ADB_SERVER_SOCKET and the adb server's
    host and port. For a command or CI step, 'farm pool exec' also heartbeats and releases."""
    request = LeaseRequest(socs=socs, min_htp_arch=min_htp, tags=tags, serial=serial, virtual=virtual,
                           priority=priority)
    config = farm_config()
    with _open(config) as p:
        got = _acquire(config, p, request, Holder.current(purpose=purpose), ttl, timeout)
    env = lease_env(got.token, got.serial, got.server)
    if fmt == "token":
        click.echo(f"{_leased_line(got)}; give it back with: farm pool release {got.token}", err=True)
        click.echo(got.token)
    elif fmt == "json":
        click.echo(json.dumps({"token": got.token, "serial": got.serial, "server": got.server,
                               "soc": got.device.soc, "htp_arch": got.device.htp_arch,
                               "expires": got.info.expires, "env": env}))
    else:
        click.echo(_leased_line(got), err=True)
        for key, value in env.items():
            click.echo(f"export {key}={shlex.quote(value)}")


class _Interrupted(BaseException):
    """SIGINT/SIGTERM while ``farm pool exec`` waits for its lease (leaves the queue on the way out)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Exec:
    """One ``farm pool exec``: the leased device's command, its signals and its end."""

    def __init__(self, lease: Lease, command: list[str]):
        self.lease, self.command = lease, command
        self.child: subprocess.Popen | None = None
        self.kill_at: float | None = None  # SIGKILL the command's group then, if it is still running
        self.lost: LeaseLost | None = None
        self.signalled: int | None = None  # the first signal, also one that came before the start

    def stop(self, signum: int) -> None:
        """Send ``signum`` to the command's process group; SIGKILL it after EXEC_KILL_GRACE_S."""
        self.signalled = self.signalled or signum
        if self.child is None or self.child.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + EXEC_KILL_GRACE_S

    def run(self) -> int:
        lease = self.lease
        env = {**os.environ, **lease_env(lease.token, lease.serial, lease.server)}
        env["PATH"] = with_farm_adb(env.get("PATH", ""))
        try:
            # A process group of its own: a signal reaches the command's whole tree (sh -c '...').
            self.child = subprocess.Popen(self.command, env=env, process_group=0)
        except OSError as e:
            raise UsageError(f"{self.command[0]}: cannot run: {e.strerror}") from None
        if self.signalled is not None:  # a signal between the grant and the start
            self.stop(self.signalled)
        give_back = _hand_terminal(self.child.pid)
        try:
            while True:
                try:
                    code = self.child.wait(timeout=EXEC_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if self.lost is None:
                    try:
                        lease.check()  # the heartbeat failed for longer than the TTL, or was refused
                    except LeaseLost as e:
                        self.lost = e
                        click.echo(f"farm: error: {e}; stopping {self.command[0]}", err=True)
                        self.stop(signal.SIGTERM)
                if self.kill_at is not None and time.monotonic() >= self.kill_at:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.child.pid, signal.SIGKILL)
                    self.kill_at = float("inf")
        finally:
            give_back()
            # Whatever is left of the command's group (a child that outlived it) goes too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signal.SIGKILL)
        return 128 - code if code < 0 else code


def _hand_terminal(pgid: int) -> Callable[[], None]:
    """Make ``pgid`` the terminal's foreground group (as a shell does for a job), so that an interactive
    command reads the terminal and Ctrl-C reaches it alone; returns how to take the terminal back."""
    try:
        fd = sys.stdin.fileno()
        if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
            return lambda: None
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        os.tcsetpgrp(fd, pgid)
    except (OSError, ValueError, AttributeError):
        return lambda: None

    def give_back() -> None:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, os.getpgrp())
        signal.signal(signal.SIGTTOU, previous)
    return give_back


@contextlib.contextmanager
def _signals(on_signal: Callable[[int], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call ``on_signal`` for the duration of the block."""
    previous = {s: signal.signal(s, lambda signum, frame: on_signal(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _release(lease: Lease) -> None:
    """Give ``farm pool exec``'s lease back. A refusal (the lease had ended) or a pool that is gone
    is a LeaseError for ``hold`` to record: the lease did not outlive the command. The pool being out
    of reach for a moment is only a warning: the lease ends by its TTL, and the command ended before
    its fence deadline (checked before this)."""
    try:
        lease.release()
    except PoolLost as e:  # deleted or replaced: another pool may lease the device already
        raise LeaseError(str(e)) from e
    except PoolError as e:
        click.echo(f"farm: warning: lease {lease.token[:8]} on {lease.serial} not released: {e}",
                   err=True)
    else:
        click.echo(f"farm: released {lease.serial}", err=True)


def exec_command(request: LeaseRequest, holder: Holder, ttl: float | None, timeout: float | None,
                 command: list[str]) -> int:
    """Lease, run ``command`` with the device's environment while a heartbeat renews the lease, and
    release; returns the command's exit code (128+N if signal N ended it)."""
    run: _Exec | None = None

    def on_signal(signum: int) -> None:
        if run is None:
            raise _Interrupted(signum)  # still waiting: acquire leaves the queue on the way out
        run.stop(signum)  # forwarded; once the command has exited, the release is not interrupted

    config = farm_config()
    with _open(config) as pool, _signals(on_signal):
        try:
            lease = _acquire(config, pool, request, holder, ttl, timeout)
        except _Interrupted as e:
            click.echo(f"farm: interrupted ({e}) while waiting for a lease", err=True)
            return ExitCode.INTERRUPTED
        run = _Exec(lease, command)
        try:
            # outlive: a lease that ended before the command did, noticed by the heartbeat, by the
            # check below or by the release (refused, or the pool gone), is LeaseLost, exit 3.
            with hold(lease, release=_release, outlive=shlex.join(command)):
                open_tunnel_for(config, lease.server)  # the command's adb talks to that server
                click.echo(f"farm: {_leased_line(lease)}; running {shlex.join(command)}", err=True)
                code = run.run()
                if run.lost is None:
                    try:  # the command may have ended before a heartbeat noticed anything
                        lease.check()
                    except LeaseLost as e:
                        run.lost = e
        except LeaseLost as e:
            raise run.lost or e from None
    if run.lost is not None:
        raise run.lost
    if run.signalled is not None:
        click.echo(f"farm: {signal.Signals(run.signalled).name}: {command[0]} ended with {code}",
                   err=True)
    return code


@pool.command("exec", context_settings={"allow_interspersed_args": False})
@pool_options
@request_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(command: tuple[str, ...], socs: tuple[str, ...], min_htp: str | None,
          tags: tuple[str, ...], serial: str | None, virtual: bool | None, priority: str,
          ttl: float | None, timeout: float | None, purpose: str) -> None:
    """Lease a device, run COMMAND with it, release it; exit with COMMAND's exit code.

    \b
        farm pool exec --soc SM8650 --priority pr -- ./ci/device-step.sh
        farm pool exec --soc SM8650 -- farm run "$M" --prompt Hello

    Waits for the device like 'farm pool lease'. COMMAND gets ANDROID_SERIAL, ADB_SERVER_SOCKET,
    ANDROID_ADB_SERVER_HOST/PORT (the device's adb server), PTEFARM_LEASE (the token, which
    'farm deploy' and 'farm run' need) and the farm's adb first on PATH (for scripts that run
    'adb', such as upstream's SimpleADB). A heartbeat renews the lease while COMMAND runs, so --ttl
    bounds how long a crashed holder keeps the device, not how long COMMAND may take. SIGINT and
    SIGTERM are forwarded to COMMAND (its process group; SIGKILL after 10 s) and the lease is
    released. COMMAND killed by signal N: 128+N. If the lease is lost, COMMAND is stopped: exit 3.
    """
    request = LeaseRequest(socs=socs, min_htp_arch=min_htp, tags=tags, serial=serial, virtual=virtual,
                           priority=priority)
    holder = Holder.current(purpose=purpose or f"farm pool exec {shlex.join(command)}"[:200])
    sys.exit(exec_command(request, holder, ttl, timeout, list(command)))


@pool_command
@click.argument("token")
@click.option("--ttl", type=float, default=None, callback=_seconds("--ttl"),
              help="New TTL from now (default: config).")
def renew(token: str, ttl: float | None) -> None:
    """Extend a lease taken with 'farm pool lease'."""
    info = _with_pool(lambda p: p.renew(token, ttl if ttl is not None else p.default_ttl_s))
    click.echo(f"{info.serial}: lease renewed for {info.expires - info.renewed:g}s")


@pool_command
@click.argument("token")
def release(token: str) -> None:
    """Give a leased device back to the pool."""
    info = _with_pool(lambda p: p.release(token))
    click.echo(f"{info.serial}: released")


@pool_command
@click.argument("serial")
@click.option("--reason", required=True, help="Why: shown in status until the device is restored.")
def quarantine(serial: str, reason: str) -> None:
    """Take a device out of the pool until 'farm pool restore'."""
    _with_pool(lambda p: p.quarantine(serial, reason))
    click.echo(f"{serial}: quarantined ({reason})")


@pool_command
@click.argument("serial")
def restore(serial: str) -> None:
    """Return a quarantined device to the pool and reset its failure count."""
    state = _with_pool(lambda p: p.restore(serial))
    click.echo(f"{serial}: {state}")


def _event_line(e: Event) -> str:
    at = dt.datetime.fromtimestamp(e.at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    change = f" {e.from_state or '-'} -> {e.to_state}" if e.to_state else ""
    subject = e.serial or (f"queue#{e.queue_id}" if e.queue_id is not None else "")
    bits = [f"{at}Z #{e.id} {e.kind:<14} {subject}{change}"]
    if e.holder:
        bits.append(f"by {e.holder}")
    if e.token:
        bits.append(f"lease {e.token[:8]}")
    if e.detail and e.kind not in (EventKind.LEASED, EventKind.QUEUED):
        bits.append(e.detail)
    return "  ".join(bits)


@pool_command
@click.option("--serial", default=None, help="Only this device.")
@click.option("--token", default=None, help="Only this lease.")
@click.option("--limit", type=int, default=50, show_default=True, help="Last N events.")
@json_option
def history(serial: str | None, token: str | None, limit: int,
            as_json: bool) -> None:
    """The event log: every state change, oldest first."""
    events = _with_pool(lambda p: p.history(serial=serial, token=token, limit=limit))
    if as_json:
        click.echo(json.dumps([e.to_dict() for e in events], indent=2))
        return
    for e in events:
        click.echo(_event_line(e))
