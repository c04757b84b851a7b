"""``farm devices``, ``farm deploy`` and ``farm run``: the device layer from the command line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

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

from farm import bundle as bundle_mod
from farm.cli.options import config_option, farm_config, json_option
from farm.config import FarmConfig, finite_seconds
from farm.deploy import VERIFY_LEVELS, DeployReport, deploy
from farm.devices import Device, DeviceInfo, find_device, scan_server
from farm.errors import UsageError
from farm.run import RunnerFailed, RunResult, run
from farm.runprofile import UPDATERS, RunRequest
from farm.vocab import Updater

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
                  "yes" if d.virtual else "", _gb(d.free_bytes),
                  "" if d.battery_level is None else f"{d.battery_level}%", temps]


@click.command("devices")
@config_option
@json_option
def devices(as_json: bool) -> None:
    """List every device of every configured adb server with its attributes."""
    config = farm_config()
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
        Console().print(table)
        err = Console(stderr=True)
        for s in scans:
            if s.error:
                err.print(f"farm: error: {s.error}", markup=False)
    if any(s.error for s in scans):
        sys.exit(3)  # an unreachable server is an infrastructure failure, after listing the rest


def _open_device(config: FarmConfig, serial: str) -> Device:
    return find_device(config.adb_servers, serial, workspace_root=config.run.workspace)


def _deploy_with_progress(device: Device, bundle: bundle_mod.Bundle, verify: str,
                          timeout: float, quiet: bool) -> DeployReport:
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=console,
                  disable=quiet or not console.is_terminal) as progress:
        task = progress.add_task(f"deploy {bundle.name} -> {device.serial}", total=None)

        def on_plan(total: int) -> None:
            progress.update(task, total=total or 1, completed=0 if total else 1)

        def on_progress(name: str, n: int) -> None:
            progress.update(task, advance=n, description=f"push {name}")

        return deploy(device, bundle, verify=verify, on_plan=on_plan, on_progress=on_progress,
                      timeout=timeout)


@click.command("deploy")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--serial", "-s", required=True, help="device serial (see `farm devices`)")
@click.option("--verify", type=click.Choice(VERIFY_LEVELS), default="fast", show_default=True,
              help="fast: trust the device's record when size+mtime match; full: sha256 every file")
@config_option
@json_option
def deploy_cmd(manifest: str, serial: str, verify: str, as_json: bool) -> None:
    """Push a bundle to a device's workspace, skipping files it already holds."""
    config = farm_config()
    bundle = bundle_mod.load(manifest, verify=True)  # sizes, sha256, paths: before any device
    device = _open_device(config, serial)
    report = _deploy_with_progress(device, bundle, verify, timeout=min(config.run.command_timeout_s, 120.0),
                                   quiet=as_json)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.summary())


def _print_result(result: RunResult) -> None:
    click.echo(result.text if result.text is not None else result.stdout)
    rates = [("tok/s", result.tokens_per_s), ("decode tok/s", result.decode_tok_s),
             ("prefill tok/s", result.prefill_tok_s)]
    figures = ", ".join(f"{name} {value:.1f}" for name, value in rates if value is not None)
    click.echo(f"-- {result.serial} {result.mode}/{result.updater}: {figures or 'no figures'}; "
               f"{len(result.generated_ids or [])} generated ids; {result.duration_s:.2f} s", err=True)


@click.command("run")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--serial", "-s", required=True, help="device serial (see `farm devices`)")
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
@config_option
@json_option
def run_cmd(manifest: str, serial: str, prompts: tuple[str, ...], system_prompt: str | None,
            mode: str, updater: str, seq_len: int, temperature: float, num_iters: int,
            seed: int | None, timeout: float | None, out_dir: str | None, no_deploy: bool,
            as_json: bool) -> None:
    """Deploy a bundle (cached) and run its runner on a device; prints the generated text."""
    for prompt in prompts:
        _check_text("--prompt", prompt)
    _check_text("--system-prompt", system_prompt)
    if not math.isfinite(temperature):
        raise UsageError(f"--temperature: must be a finite number, got {temperature!r}")
    config = farm_config()
    bundle = bundle_mod.load(manifest)
    if not no_deploy:
        bundle_mod.verify_bundle(bundle)  # a corrupt or changed file is refused before any device
    request = RunRequest(prompts=list(prompts), mode=mode, updater=updater,
                         system_prompt=system_prompt, seq_len=seq_len, temperature=temperature,
                         num_iters=num_iters, seed=seed)
    request.check()
    device = _open_device(config, serial)
    if not no_deploy:
        _deploy_with_progress(device, bundle, "fast", timeout=min(config.run.command_timeout_s, 120.0),
                              quiet=True)
    try:
        result = run(device, bundle, request, timeout=timeout or config.run.command_timeout_s,
                     local_dir=Path(out_dir) if out_dir else None)
    except RunnerFailed as e:
        if as_json:
            click.echo(json.dumps(e.result.to_dict(), indent=2))
        else:
            sys.stderr.write(e.result.stderr)
        click.echo(f"farm: error: {e} [RunnerFailed]", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        _print_result(result)


COMMANDS = (devices, deploy_cmd, run_cmd)
