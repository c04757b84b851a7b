"""``farm virtual up|down|ls|set|reboot|offline|online``: virtual Snapdragon devices behind the farm's own
adb server.

``up``, ``down``, ``offline`` and ``online`` sync the pool with that server afterwards: started devices are available at
once, stopped ones offline (nobody is handed a dead device)."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from farm.cli.options import config_option, farm_config, json_option
from farm.config import AdbServerAddress
from farm.runner.timing import Slowdown
from farm.session import parse_soc_counts
from farm.virtual import SOC_PROFILES, VirtualDeviceSpec, VirtualFarm
from farm.virtual.identity import load_identity


def _sync_pool(server: AdbServerAddress) -> None:
    """Bring the pool in step with the farm's adb server after devices started or stopped: new
    devices become available, stopped ones go offline (a stopped server lists none)."""
    from farm.device.discovery import scan_server
    from farm.pool import Pool

    config = farm_config()
    scan = scan_server(server, workspace_root=config.run.workspace)
    with Pool.from_config(config) as pool:
        report = pool.sync(scan.devices, [server])
    changes = [f"{label} {', '.join(serials)}" for label, serials in
               (("added", report.added), ("back online", report.returned),
                ("offline", report.vanished)) if serials]
    click.echo(f"pool {pool.store.display_url}: " + ("; ".join(changes) or "in step"))


def _farm(owner_pid: int | None = None) -> VirtualFarm:
    config = farm_config()
    # Devices outlive this command: they are not tied to its pid; `farm virtual down` ends them, or
    # the end of ``owner_pid`` (--exit-with-pid).
    return VirtualFarm(home=config.home, adb_port=config.adb_servers[0].port, tie_to_owner=False,
                       owner_pid=owner_pid)


@click.group("virtual")
@config_option
def virtual() -> None:
    """Virtual Snapdragon devices (processes speaking ADB on loopback) for running the farm
    without phones. State: <farm home>/virtual/state.json."""


@virtual.command("up")
@click.option("--soc", "socs", multiple=True, metavar="SOC[:N]",
              help="SoC of the devices to start, e.g. SM8650; SM8650:2 starts two. Repeatable. "
                   f"Known: {', '.join(sorted(SOC_PROFILES))}. Default: one SM8650.")
@click.option("--count", "counts", multiple=True, type=int, metavar="N",
              help="How many of each --soc: one --count per --soc (paired in order), or a single "
                   "--count for every --soc.")
@click.option("--platform-only", is_flag=True,
              help="Omit ro.soc.model (only ro.board.platform), like older builds.")
@click.option("--timing", type=click.Choice(["host", "phone"]), default=None,
              help="host: the runner reports the host CPU's timing; phone: a simulated phone's "
                   "(its SoC's published figures, noise, heat and throttling; every figure marked "
                   "simulated). Default: the config's virtual.timing, else host.")
@click.option("--exit-with-pid", "owner_pid", type=int, default=None, metavar="PID",
              help="The devices and their adb server end when process PID does (a script that "
                   "starts devices for its steps passes its own $$: killed, it leaves none behind).")
@config_option
def up(socs: tuple[str, ...], counts: tuple[int, ...], platform_only: bool, timing: str | None,
       owner_pid: int | None) -> None:
    """Start virtual devices and connect them to the farm's adb server.

    \b
    Examples:
      farm virtual up --soc SM8650:2 --soc SM8550
      farm virtual up --soc SM8650 --count 2 --soc SM8550 --count 1
    """
    pairs = parse_soc_counts(socs, counts)
    timing = timing or farm_config().virtual.timing
    specs = [VirtualDeviceSpec(soc=soc, platform_only=platform_only, timing=timing)
             for soc, n in pairs for _ in range(n)]
    vf = _farm(owner_pid)
    started = vf.up(specs)  # on failure it ends what it started
    table = Table(title=f"virtual devices on adb server {vf.adb_server}")
    for col in ("serial", "SoC", "platform", "model", "pid", "workspace"):
        table.add_column(col)
    for r in started:
        props = load_identity(r.root).props
        table.add_row(r.serial, props.get("ro.soc.model", "-"), props["ro.board.platform"],
                      props["ro.product.model"], str(r.pid),
                      r.workspace + ("" if r.confined else " (unconfined)"))
    Console().print(table)
    click.echo(f"use: farm adb devices -l   (the farm's adb server, port {vf.adb_server.port})")
    _sync_pool(vf.adb_server)


@virtual.command("down")
@config_option
def down() -> None:
    """Disconnect and stop every virtual device and the adb server `up` started (also after a
    crash)."""
    vf = _farm()
    n = len(vf.devices)
    vf.down()
    click.echo(f"stopped {n} virtual device(s)")
    if vf.left_running_for:
        click.echo(f"adb server {vf.adb_server} left running: it also serves "
                   f"{', '.join(vf.left_running_for)} (not this farm home's); 'farm virtual down' "
                   f"stops it once they are gone")
    _sync_pool(vf.adb_server)


@virtual.command("ls")
@json_option
@config_option
def ls(as_json: bool) -> None:
    """List the virtual devices, whether their process runs and their adb state."""
    vf = _farm()
    statuses = vf.ls()
    if as_json:
        click.echo(json.dumps({
            "adb_server": str(vf.adb_server),
            "devices": [{**s.process.to_json(), "alive": s.alive, "adb_state": s.adb_state}
                        for s in statuses]}, indent=1))
        return
    table = Table(title=f"virtual devices on adb server {vf.adb_server}")
    for col in ("serial", "SoC", "pid", "process", "adb state", "confinement", "root"):
        table.add_column(col)
    for s in statuses:
        table.add_row(s.process.serial, s.process.soc, str(s.process.pid),
                      "running" if s.alive else "dead", s.adb_state,
                      "view" if s.process.confined else "unconfined", str(s.process.root))
    Console().print(table)


def _zone(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, float]:
    zones: dict[str, float] = {}
    for value in values:
        zone, sep, temp = value.rpartition("=")
        try:
            zones[zone] = float(temp)
        except ValueError:
            raise click.BadParameter(f"{value!r}: expected ZONE=DEGREES_C, e.g. cpu-1-0=45 or "
                                     f"thermal_zone2=45.5", param=param) from None
        if not sep or not zone:
            raise click.BadParameter(f"{value!r}: expected ZONE=DEGREES_C", param=param)
    return zones


@virtual.command("set")
@click.argument("serial")
@click.option("--battery-level", type=click.IntRange(0, 100), default=None, metavar="PERCENT",
              help="Battery level in %.")
@click.option("--battery-temp", type=float, default=None, metavar="C",
              help="Battery temperature in deg C (what `dumpsys battery` and the cooldown read).")
@click.option("--battery-status", type=click.Choice(["Charging", "Discharging", "Not charging",
                                                     "Full", "Unknown"]), default=None)
@click.option("--thermal", "thermal", multiple=True, callback=_zone, metavar="ZONE=C",
              help="A thermal zone's temperature in deg C; ZONE is its type (cpu-1-0, nsphvx-0), "
                   "thermal_zoneN or N; a new type adds a zone. Repeatable.")
@json_option
@config_option
def set_state(serial: str, battery_level: int | None, battery_temp: float | None,
              battery_status: str | None, thermal: dict[str, float], as_json: bool) -> None:
    """Set a virtual device's battery and thermal zones (at once, running or offline).

    \b
    Examples:
      farm virtual set 127.0.0.1:40001 --battery-temp 45 --thermal cpu-1-0=80
      farm virtual set 127.0.0.1:40001 --battery-level 15 --battery-status Discharging
    """
    state = _farm().set_phone(serial, battery_level=battery_level, battery_temp_c=battery_temp,
                              battery_status=battery_status, thermal=thermal)
    if as_json:
        click.echo(json.dumps(state.to_json(), indent=1))
        return
    zones = ", ".join(f"{z.type}={z.temp_c:g}" for z in state.thermal)
    click.echo(f"{serial}: battery {state.battery_level}% {state.battery_temp_c:g} C "
               f"{state.battery_status}; thermal {zones}")


@virtual.command("slowdown")
@click.argument("serial")
@click.option("--flag", "flags", multiple=True, metavar="NAME=VALUE:FACTOR",
              help="Runs given this runner flag value take FACTOR times as long, e.g. "
                   "kv_updater=SmartMask:1.05. Repeatable.")
@click.option("--model-sha256", "models", multiple=True, metavar="SHA256:FACTOR",
              help="Runs of the model file with this digest take FACTOR times as long. Repeatable.")
@config_option
def slowdown(serial: str, flags: tuple[str, ...], models: tuple[str, ...]) -> None:
    """Set a simulated phone's slowdown knobs, replacing its earlier ones (none given: clears them).
    Only for a device started with --timing phone; takes effect at its next run."""
    knobs = tuple([_knob(f, "--flag") for f in flags] + [_knob(m, "--model-sha256") for m in models])
    _farm().set_slowdowns(serial, knobs)
    click.echo(f"{serial}: " + (", ".join(_knob_text(k) for k in knobs) or "no slowdown"))


def _knob(text: str, option: str) -> Slowdown:
    what, sep, factor = text.rpartition(":")
    try:
        value = float(factor)
    except ValueError:
        value = None
    name, eq, flag_value = what.partition("=")
    if not sep or value is None or (option == "--flag" and not (eq and name and flag_value)) or not what:
        raise click.BadParameter(f"{text!r}: expected "
                                 + ("NAME=VALUE:FACTOR" if option == "--flag" else "SHA256:FACTOR"),
                                 param_hint=option)
    if option == "--flag":
        return Slowdown(factor=value, flag=name, value=flag_value)
    return Slowdown(factor=value, model_sha256=what)


def _knob_text(k: Slowdown) -> str:
    what = f"--{k.flag} {k.value}" if k.flag else f"model {k.model_sha256[:12]}"
    return f"{what} x{k.factor:g}"


@virtual.command("reboot")
@click.argument("serial")
@config_option
def reboot(serial: str) -> None:
    """`adb reboot` a virtual device and wait until it is back: same port and storage, every process
    of the previous boot gone."""
    vf = _farm()
    dev = vf.reboot(serial)
    click.echo(f"{dev.serial}: rebooted (pid {dev.pid})")


@virtual.command("offline")
@click.argument("serial")
@config_option
def offline(serial: str) -> None:
    """Stop a virtual device's process, like a phone that died or was unplugged: the adb server
    lists it offline. `farm virtual online` brings it back with its storage."""
    vf = _farm()
    vf.kill(serial)
    click.echo(f"{serial}: offline")
    _sync_pool(vf.adb_server)


@virtual.command("online")
@click.argument("serial")
@config_option
def online(serial: str) -> None:
    """Start an offline virtual device again, on the same port with the same storage."""
    vf = _farm()
    dev = vf.restart(serial)
    click.echo(f"{dev.serial}: online (pid {dev.pid})")
    _sync_pool(vf.adb_server)
