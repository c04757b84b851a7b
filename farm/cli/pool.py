"""``farm pool ...``: the shared device pool from the shell and from CI jobs.

    TOKEN=$(farm pool lease --soc SM8650 --ttl 3600 --priority pr)
    eval "$(farm pool lease --soc SM8650 --format env)"   # PTEFARM_LEASE_TOKEN, ANDROID_SERIAL, ...
    farm pool release "$TOKEN"

A lease taken here has no heartbeat (the command exits): it lives for its TTL unless renewed with
``farm pool renew``; pick a TTL that covers the job, and release when done.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
import sys
from collections.abc import Callable
from typing import TypeVar

import click
from rich.console import Console
from rich.table import Table

from farm.cli.options import config_option, farm_config, json_option, pool_url_option
from farm.config import finite_seconds
from farm.errors import AdbError
from farm.pool import Event, Holder, LeaseRequest, Pool, PoolStatus

T = TypeVar("T")

# What `farm pool sync` reports, from the events the sync wrote: (label, event kind).
SYNC_CHANGES = (("added", "added"), ("back online", "online"), ("offline", "offline"),
                ("updated", "updated"))


def _seconds(flag: str, *, allow_zero: bool = False):
    """A click callback: the flag's value must be a finite positive number (UsageError, one line)."""
    return lambda ctx, param, value: finite_seconds(value, flag, allow_zero=allow_zero)


def pool_options(f):
    """``--config`` and ``--url``, accepted on ``farm pool`` and after each of its sub-commands."""
    return config_option(pool_url_option(f))


def _open() -> Pool:
    return Pool.from_config(farm_config())


def _with_pool(call: Callable[[Pool], T]) -> T:
    """``call`` on the configured pool, closed afterwards."""
    with _open() as p:
        return call(p)


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
    last = _with_pool(lambda p: p.history(limit=1))
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
    for col in ("serial", "server", "soc", "htp", "state", "holder", "expires in", "fails", "reason"):
        devices.add_column(col)
    for d in status.devices:
        dev, lease = d.device, d.lease
        devices.add_row(dev.serial, dev.server, dev.soc or "?", dev.htp_arch or "?", dev.state,
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
    # Not a terminal (CI logs, pipes): do not wrap rows at 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 200)
    if not st.devices:
        click.echo("the pool has no devices: run 'farm pool sync'")
    for table in _status_tables(st):
        console.print(table)


@pool_command
@click.option("--soc", "socs", multiple=True, help="Acceptable SoC (repeatable), e.g. SM8650.")
@click.option("--min-htp", default=None, help="Minimum HTP arch, e.g. v73.")
@click.option("--tag", "tags", multiple=True, help="Required device tag (repeatable).")
@click.option("--serial", default=None, help="This device and no other.")
@click.option("--virtual/--physical", "virtual", default=None, help="Only virtual / physical devices.")
@click.option("--priority", default="adhoc", show_default=True,
              help="release, nightly, pr, adhoc, or an integer; higher is served first.")
@click.option("--ttl", type=float, default=None, callback=_seconds("--ttl"),
              help="Lease TTL in seconds (default: config).")
@click.option("--timeout", type=float, default=None, callback=_seconds("--timeout", allow_zero=True),
              help="Wait at most this long, 0: do not wait (default: config).")
@click.option("--purpose", default="", help="Shown to others in status and timeout errors.")
@click.option("--format", "fmt", type=click.Choice(["token", "env", "json"]), default="token",
              show_default=True, help="token: the token only; env: shell assignments; json.")
def lease(socs: tuple[str, ...], min_htp: str | None, tags: tuple[str, ...],
          serial: str | None, virtual: bool | None, priority: str, ttl: float | None,
          timeout: float | None, purpose: str, fmt: str) -> None:
    """Lease a device and print its token (no heartbeat: renew or release it yourself)."""
    request = LeaseRequest(socs=socs, min_htp_arch=min_htp, tags=tags, serial=serial, virtual=virtual,
                           priority=priority)
    got = _with_pool(lambda p: p.acquire(request, Holder.current(purpose=purpose), ttl_s=ttl,
                                         timeout_s=timeout))
    if fmt == "token":
        click.echo(got.token)
    elif fmt == "json":
        click.echo(json.dumps({"token": got.token, "serial": got.serial, "server": got.server,
                               "expires": got.info.expires}))
    else:
        for key, value in (("PTEFARM_LEASE_TOKEN", got.token), ("ANDROID_SERIAL", got.serial),
                           ("ADB_SERVER_SOCKET", f"tcp:{got.server}")):
            click.echo(f"{key}={shlex.quote(value)}")


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
    if e.detail and e.kind not in ("leased", "queued"):
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
