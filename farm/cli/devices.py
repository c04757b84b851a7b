"""``farm devices``, ``farm deploy`` and ``farm run``: the device layer from the command line."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from farm.bundle import manifest as bundle_mod
from farm.cli.options import config_option, farm_config, json_option
from farm.cli.progress import console as cli_console
from farm.config import FarmConfig, finite_seconds
from farm.session import open_tunnels
from farm.device.discovery import find_device, scan_server
from farm.device.probe import Device, DeviceInfo
from farm.errors import InfraError, LeaseError, PoolError, UsageError
from farm.execute.chunking import ChunkPolicy
from farm.execute.deploy import VERIFY_LEVELS, DeployReport, deploy
from farm.execute.run import RunnerFailed, RunResult, run
from farm.execute.runprofile import UPDATERS, RunRequest
from farm.exitcodes import ExitCode
from farm.vocab import DeviceState, Dialect, Timing, Updater

LEASE_ENV = "PTEFARM_LEASE"  # the token `farm pool exec` gives its command
# The manifest's model fields that give the context length (as farm.cases.context_len reads them).
def _check_timeout(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    return finite_seconds(value, "--timeout")


def _check_text(flag: str, text: str | None) -> None:
    """Command-line text must be valid UTF-8: an undecodable byte reaches Python as a lone surrogate,
    which no device command can carry. One line naming the flag, not a traceback."""
    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else repr(bad)
        raise UsageError(f"{flag}: not valid UTF-8 ({byte} at character {e.start})") from None


def _gb(n: int | None) -> str:
    return "" if n is None else f"{n / 1e9:.1f}"


def _device_row(d: DeviceInfo, with_server: bool) -> list[str]:
    ready = d.state == "device" and not d.error
    hottest = max(d.thermal.values(), default=None)
    temps = "/".join(f"{t:.0f}" for t in (d.battery_temp_c, hottest) if t is not None)
    row = [d.serial] + ([d.server] if with_server else [])
    return row + [d.state if not d.error else f"error: {d.error}", d.soc or "", d.htp_arch or "",
                  d.model or "", f"{d.android_release or '?'}/{d.sdk or '?'}" if ready else "",
                  ("unconfined" if d.confined is False else "yes") if d.virtual else "", _gb(d.free_bytes),
                  "" if d.battery_level is None else f"{d.battery_level}%", temps]


@click.command("devices")
@config_option
@json_option
def devices(as_json: bool) -> None:
    """List every device of every configured adb server with its attributes."""
    config = farm_config()
    open_tunnels(config)
    scans = [scan_server(s, workspace_root=config.run.workspace) for s in config.adb_servers]
    if as_json:
        click.echo(json.dumps({
            "servers": [{"server": str(s.server), "error": s.error} for s in scans],
            "devices": [d.to_dict() for s in scans for d in s.devices],
        }, indent=2))
    else:
        with_server = len(scans) > 1
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True)
        table.add_column("serial", no_wrap=True)
        if with_server:
            table.add_column("server", no_wrap=True)
        # battery temperature / hottest thermal zone; JSON has every attribute, the table the gist
        for col in ("state", "SoC", "HTP", "model", "android", "virt", "free GB", "batt", "temp C"):
            table.add_column(col)
        for s in scans:
            for d in s.devices:
                table.add_row(*_device_row(d, with_server))
        cli_console().print(table)  # whole lines in CI logs: serials, models never cut at 80 columns
        err = cli_console(stderr=True)
        for s in scans:
            if s.error:
                err.print(f"farm: error: {s.error}", markup=False)
    if any(s.error for s in scans):
        sys.exit(ExitCode.INFRA)  # an unreachable server is an infrastructure failure, after listing the rest


def _open_device(config: FarmConfig, serial: str) -> Device:
    open_tunnels(config)
    return find_device(config.adb_servers, serial, workspace_root=config.run.workspace)


def lease_options(f):
    """``--lease`` and ``--force``: what a command that acts on a pool device needs."""
    f = click.option("--force", is_flag=True,
                     help="use a pool device without its lease (or a quarantined one): a warning")(f)
    return click.option("--lease", "lease_token", envvar=LEASE_ENV, default=None, metavar="TOKEN",
                        help=f"the device's lease token [default: ${LEASE_ENV}, which "
                             f"'farm pool exec' sets]")(f)


def _warn(message: str) -> None:
    click.echo(f"farm: warning: {message}", err=True)


def _pool_if_any(config: FarmConfig) -> Any:
    """The configured pool, or None when there is none: the default SQLite file not created yet (a
    phone on a developer's desk, no pool ever synced) is not a pool, and is not created here."""
    from farm.pool import Pool

    if config.pool.url.startswith("sqlite:"):
        from farm.db.sqlite import sqlite_path

        if not sqlite_path(config.pool.url).exists():
            return None
    return Pool.from_config(config)


def _holder_text(status: Any) -> str:
    """Who has a pool device now, for error messages."""
    dev, lease = status.device, status.lease
    if lease is not None:
        return f"held by {lease.holder.describe()} (lease {lease.token[:8]})"
    return f"{dev.state}" + (f" ({dev.reason})" if dev.reason else "")


def _pool_entry(config: FarmConfig, serial: str, force: bool) -> tuple[Any, Any] | None:
    """(open pool, the device's DeviceStatus), or None for a device the pool does not know (or no
    pool, or --force with the pool unreachable)."""
    pool = None
    try:
        pool = _pool_if_any(config)
        if pool is None:
            return None
        status = pool.status()
    except PoolError as e:
        if pool is not None:
            pool.close()
        if not force:
            raise
        _warn(f"cannot check the pool ({e}); using {serial} without a lease (--force)")
        return None
    found = next((d for d in status.devices if d.device.serial == serial), None)
    if found is None:
        pool.close()
        return None
    return pool, found


@contextlib.contextmanager
def leased_device(config: FarmConfig, device: Device, token: str | None, force: bool) -> Iterator[Any]:
    """The device to act on, as the pool allows: a device the pool knows needs its lease token and
    is then fenced (farm.device.fence: the device itself refuses our commands once another lease claims it)
    and kept alive by a heartbeat while we use it (farm.pool.hold); a quarantined device refuses
    work. ``force`` turns every refusal into a warning. A device the pool does not know is used as it
    is."""
    from farm.pool.hold import adopt, hold

    serial = device.serial
    entry = _pool_entry(config, serial, force)
    if entry is None:  # not a pool device: as without a pool
        yield device
        return
    pool, found = entry
    with pool:
        dev = found.device
        if dev.state == DeviceState.QUARANTINED:
            if not force:
                raise InfraError(f"device {serial} is quarantined: {dev.reason or 'no reason given'} "
                                 f"('farm pool restore {serial}' returns it; --force uses it anyway)",
                                 serial=serial)
            _warn(f"device {serial} is quarantined ({dev.reason}); using it anyway (--force)")
        if token:
            try:
                lease = adopt(pool, token, serial)
            except LeaseError as e:
                problem = f"{e}; device {serial} is {_holder_text(found)}"
            else:
                # The pool says this lease holds the device now: claimed, older leases are fenced;
                # a run longer than the TTL keeps its lease.
                with hold(lease) as held:
                    yield held.claim(device, unless_ours=True)
                return
        else:
            problem = (f"device {serial} is in the pool ({_holder_text(found)}): pass its lease token "
                       f"with --lease or ${LEASE_ENV} (farm pool lease --serial {serial}, or run under "
                       f"farm pool exec --serial {serial} -- ...)")
        if not force:
            raise LeaseError(f"{problem}; or --force to use it anyway")
        _warn(f"{problem}; using it without a lease (--force)")
        yield device


def _deploy_with_progress(device: Device, bundle: bundle_mod.Bundle, verify: str,
                          timeout: float, quiet: bool, chunking: ChunkPolicy) -> DeployReport:
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=console,
                  disable=quiet or not console.is_terminal) as progress:
        task = progress.add_task(f"deploy {bundle.name} -> {device.serial}", total=None)

        def on_plan(total: int) -> None:
            progress.update(task, total=total or 1, completed=0 if total else 1)
            if total and not quiet and not console.is_terminal:  # a CI log: one line, no bar
                click.echo(f"farm deploy: pushing {total / 1e6:.1f} MB of {bundle.name} to "
                           f"{device.serial} ...", err=True)

        def on_progress(name: str, n: int) -> None:
            progress.update(task, advance=n, description=f"push {name}")

        return deploy(device, bundle, verify=verify, on_plan=on_plan, on_progress=on_progress,
                      timeout=timeout, chunking=chunking)


@click.command("deploy")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--serial", "-s", required=True, envvar="ANDROID_SERIAL",
              help="device serial (see `farm devices`) [default: $ANDROID_SERIAL]")
@click.option("--verify", type=click.Choice(VERIFY_LEVELS), default="fast", show_default=True,
              help="fast: trust the device's record when size+mtime match; full: sha256 every file")
@lease_options
@config_option
@json_option
def deploy_cmd(manifest: str, serial: str, verify: str, lease_token: str | None, force: bool,
               as_json: bool) -> None:
    """Push a bundle to a device's workspace, skipping files it already holds.

    A device of the pool needs its lease: --lease TOKEN or $PTEFARM_LEASE (see 'farm pool exec')."""
    config = farm_config()
    # Sizes and paths now; the sha256 of every file it pushes as it pushes it (one read of a new
    # bundle, not two): a corrupt file is refused at the end of its push, and nothing of it stays.
    bundle = bundle_mod.load(manifest)
    with leased_device(config, _open_device(config, serial), lease_token, force) as device:
        report = _deploy_with_progress(device, bundle, verify,
                                       timeout=min(config.run.command_timeout_s, 120.0), quiet=as_json,
                                       chunking=ChunkPolicy.configured(config.deploy))
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.summary())


def _check_context(bundle: bundle_mod.Bundle, seq_len: int) -> None:
    """A --seq-len past the context the manifest gives is bad input, refused before any device."""
    known = bundle.context()
    if known is not None and seq_len > known[0]:
        raise UsageError(f"--seq-len: {seq_len} exceeds the context of bundle {bundle.name!r} "
                         f"({known[0]} tokens, manifest field {known[1]})")


def _runner_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    return (errors or lines or ["exit code 2, no message"])[-1]


def _print_result(result: RunResult, timing: Timing) -> None:
    click.echo(result.text if result.text is not None else result.stdout)
    rates = [("tok/s", result.tokens_per_s), ("decode tok/s", result.decode_tok_s),
             ("prefill tok/s", result.prefill_tok_s)]
    figures = ", ".join(f"{name} {value:.1f}" for name, value in rates if value is not None)
    if figures and timing != Timing.MEASURED:
        figures += f" ({timing.figures})"  # a SIMULATED figure never reads as a phone's
    click.echo(f"-- {result.serial} {result.mode}/{result.updater}: {figures or 'no figures'}; "
               f"{len(result.generated_ids or [])} generated ids; {result.duration_s:.2f} s", err=True)


def _with_timing(result: dict, timing: Timing) -> dict:
    return {**result, "timing": timing.value, "figures": timing.figures}


@click.command("run")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--serial", "-s", required=True, envvar="ANDROID_SERIAL",
              help="device serial (see `farm devices`) [default: $ANDROID_SERIAL]")
@click.option("--prompt", "prompts", multiple=True, required=True, help="prompt; repeat for turns")
@click.option("--system-prompt", default=None)
@click.option("--mode", default="kv", show_default=True, help="a mode of the bundle: kv | hybrid")
@click.option("--updater", type=click.Choice([u.value for u in UPDATERS]), default=Updater.SMART_MASK.value,
              show_default=True)
@click.option("--seq-len", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--num-iters", type=int, default=1, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--timeout", type=float, default=None, callback=_check_timeout,
              help="runner timeout, s (default: config)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="also keep the pulled output files here")
@click.option("--no-deploy", is_flag=True, help="run what the device holds (no deploy check)")
@lease_options
@config_option
@json_option
def run_cmd(manifest: str, serial: str, prompts: tuple[str, ...], system_prompt: str | None,
            mode: str, updater: str, seq_len: int, temperature: float, num_iters: int,
            seed: int | None, timeout: float | None, out_dir: str | None, no_deploy: bool,
            lease_token: str | None, force: bool, as_json: bool) -> None:
    """Deploy a bundle (cached) and run its runner on a device; prints the generated text.

    A device of the pool needs its lease: --lease TOKEN or $PTEFARM_LEASE (see 'farm pool exec').
    Exit code: 0 ok, 1 the runner failed, 2 bad input (a --seq-len past the model's context too),
    3 infrastructure (device, adb, pool, lease; a quarantined device)."""
    for prompt in prompts:
        _check_text("--prompt", prompt)
    _check_text("--system-prompt", system_prompt)
    if not math.isfinite(temperature):
        raise UsageError(f"--temperature: must be a finite number, got {temperature!r}")
    config = farm_config()
    bundle = bundle_mod.load(manifest)  # the deploy checks the sha256 of what it pushes (farm deploy)
    request = RunRequest(prompts=list(prompts), mode=mode, updater=updater,
                         system_prompt=system_prompt, seq_len=seq_len, temperature=temperature,
                         num_iters=num_iters, seed=seed)
    request.check()
    _check_context(bundle, seq_len)
    with leased_device(config, _open_device(config, serial), lease_token, force) as device:
        # From its properties (read once, cached); unreadable, that is an error, never a guess.
        timing = Timing.of(device.props(), device.is_virtual)
        if not no_deploy:
            _deploy_with_progress(device, bundle, "fast",
                                  timeout=min(config.run.command_timeout_s, 120.0), quiet=True,
                                  chunking=ChunkPolicy.configured(config.deploy))
        try:
            result = run(device, bundle, request, timeout=timeout or config.run.command_timeout_s,
                         local_dir=Path(out_dir) if out_dir else None)
        except RunnerFailed as e:
            if e.result.exit_code == 2 and bundle.runner_dialect == Dialect.HOST:
                # farm-llama-runner's "bad input" (a prompt that does not fit, a --seq_len past the
                # .pte's context): the request was wrong, not the code under test.
                raise UsageError(f"the runner refused the request: {_runner_error(e.result.stderr)}") \
                    from None
            if as_json:
                click.echo(json.dumps(_with_timing(e.result.to_dict(), timing), indent=2))
            else:
                sys.stderr.write(e.result.stderr)
            click.echo(f"farm: error: {e} [RunnerFailed]", err=True)
            sys.exit(ExitCode.TEST_FAILURE)
    if as_json:
        click.echo(json.dumps(_with_timing(result.to_dict(), timing), indent=2))
    else:
        _print_result(result, timing)


COMMANDS = (devices, deploy_cmd, run_cmd)
