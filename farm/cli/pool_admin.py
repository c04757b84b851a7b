"""``farm pool tag|prune|watch``: keeping the pool true to the devices.

    farm pool tag R5CW1234ABC flagship usb3      # tags lease requests can ask for (--tag flagship)
    farm pool tag R5CW1234ABC usb3 --remove
    farm pool prune --older-than 30              # drop rows of devices offline for 30 days
    farm pool watch --interval 30                # keep devices fresh; a dead one goes offline
    farm pool watch --health                     # and check idle devices' health every 15 minutes

A device is leased only if it was seen within ``pool.liveness_s`` (a sync found it, or a test passed on
it): run ``farm pool watch`` on a host with phones (or as a service) so that idle devices stay leasable
and one that dies goes offline within the interval.
"""

from __future__ import annotations

import signal
import threading
import time

import click

from farm.cli.options import config_option, farm_config, older_than_days, older_than_option, pool_url_option
from farm.config import finite_seconds
from farm.errors import InfraError, UsageError
from farm.pool import Pool

PRUNE_EVERY_S = 3600.0  # `farm pool watch` applies the retention setting this often
HEALTH_EVERY_S = 900.0  # `farm pool watch --health`: LAVA's health checks are hours apart; ours are cheap


def _pool_options(f):
    return config_option(pool_url_option(f))


@click.command("tag")
@click.argument("serial")
@click.argument("tags", nargs=-1, required=True)
@click.option("--remove", is_flag=True, help="Take these tags away instead of adding them.")
@_pool_options
def tag(serial: str, tags: tuple[str, ...], remove: bool) -> None:
    """Add tags to a device (or --remove them); lease requests match them with --tag.

    Tags set here stay until removed; tags of the config's [[devices]] are applied on every sync
    and are changed in the config."""
    with Pool.from_config(farm_config()) as pool:
        device = pool.tag(serial, tags, remove=remove)
    click.echo(f"{serial}: tags {', '.join(device.tags) or 'none'}")


@click.command("prune")
@older_than_option("Drop devices offline for longer than this many days [default: the config's "
                   "pool.retention_days].")
@_pool_options
def prune(days: float | None) -> None:
    """Forget devices that have been offline for long (and their old events and ended leases).

    A device with a live lease is kept, and so is a quarantined one (restore it first)."""
    config = farm_config()
    days = older_than_days(days, config.pool.retention_days, allow_zero=True)
    with Pool.from_config(config) as pool:
        pruned = pool.prune(days * 86400)
    click.echo(f"pruned {len(pruned)} device(s) offline for over {days:g} day(s)"
               + (f": {', '.join(pruned)}" if pruned else ""))


@click.command("watch")
@click.option("--interval", type=float, default=None, metavar="S",
              help="Seconds between passes [default: a quarter of pool.liveness_s, at most 30].")
@click.option("--health", is_flag=True,
              help="Also check every idle device's health (a shell answers, booted, room in the "
                   "workspace) at start and every --health-every seconds; a failing device climbs "
                   "the recovery ladder ([recovery] in the config) and is quarantined if it stays bad.")
@click.option("--health-every", type=float, default=HEALTH_EVERY_S, show_default=True, metavar="S",
              help="Seconds between health checks.")
@_pool_options
def watch(interval: float | None, health: bool, health_every: float) -> None:
    """Keep the pool in step with the adb servers until SIGTERM or Ctrl-C.

    Syncs every configured adb server once, then every S seconds asks each server for its device
    list (no command runs on the devices): listed devices stay fresh within pool.liveness_s, a
    device that appears, returns, vanishes or turns unusable gets a full sync, and the devices of a
    server that stops answering go offline. Applies pool.retention_days (prune) once an hour."""
    from farm.session import open_farm, watch_interval  # adb only here

    config = farm_config()
    if interval is not None:
        finite_seconds(interval, "--interval")
    every = watch_interval(config.pool.liveness_s) if interval is None else interval
    finite_seconds(health_every, "--health-every")
    if every >= config.pool.liveness_s:
        raise UsageError(f"--interval {every:g}: must be shorter than pool.liveness_s "
                         f"({config.pool.liveness_s:g}s), or idle devices go stale between passes")
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with open_farm(config, watch=False) as farm:
            servers = ", ".join(str(s) for s in farm.servers)
            click.echo(f"watching {servers} every {every:g}s (liveness bound "
                       f"{config.pool.liveness_s:g}s)", err=True)
            pruned_at = -PRUNE_EVERY_S
            checked_at = -health_every
            while not stop.is_set():
                if health and time.monotonic() - checked_at >= health_every:
                    _health_pass(farm, config)
                    checked_at = time.monotonic()
                if time.monotonic() - pruned_at >= PRUNE_EVERY_S:
                    pruned = farm.pool.prune(config.pool.retention_days * 86400)
                    if pruned:
                        click.echo(f"pruned: {', '.join(pruned)}", err=True)
                    pruned_at = time.monotonic()
                if stop.wait(every):
                    break
                try:
                    synced = farm.refresh()
                except InfraError as e:  # the pool is down, say: keep watching
                    click.echo(f"farm pool watch: pass failed: {e}", err=True)
                    continue
                for server in synced:
                    click.echo(f"synced {server}", err=True)
                for problem in farm.unreachable:
                    click.echo(f"unreachable: {problem}", err=True)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    click.echo("stopped", err=True)


def _health_pass(farm, config) -> None:
    try:
        checks = farm.check_health(config.recovery)
    except InfraError as e:  # the pool is down, say: the next pass tries again
        click.echo(f"farm pool watch: health check failed: {e}", err=True)
        return
    passed = [c.serial for c in checks if c.verdict == "passed"]
    click.echo(f"health: {len(passed)} of {len(checks)} idle device(s) passed", err=True)
    for c in checks:
        if c.verdict != "passed":
            click.echo(f"health: {c.serial} {c.verdict}: {c.detail}", err=True)


def _register() -> None:
    from farm.cli.pool import pool

    for command in (tag, prune, watch):
        pool.add_command(command)


_register()
