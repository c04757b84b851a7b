"""`farm qualify`: the main job. Every SoC runs every case on leased devices, in parallel; reports."""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from farm.cli.virtual import parse_soc_counts
from farm.config import load_config
from farm.errors import UsageError


@click.command()
@click.option("--virtual", "virtual_socs", multiple=True, metavar="SOC[:N]",
              help="run on fresh virtual devices (repeatable: --virtual SM8650:2 --virtual SM8550) "
                   "with a private adb server and pool, all stopped at the end")
@click.option("--bundle", "manifest", type=click.Path(dir_okay=False), default=None,
              help="bundle manifest to qualify [default: the exported reference bundle]")
@click.option("--model", "model_config", default="tiny", show_default=True,
              help="reference config to export when no --bundle is given")
@click.option("--soc", "socs", multiple=True,
              help="SoCs to qualify [default: every SoC in the pool]")
@click.option("--seq-len", type=int, default=128, show_default=True,
              help="prompt + generated tokens, capped at the model's context")
@click.option("--workers", type=int, default=0, help="parallel device workers [default: one per device]")
@click.option("--priority", default="release", show_default=True,
              help="lease priority: release, nightly, pr, adhoc or a number")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="report directory [default: reports/qualify-<time>]")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None)
def qualify(virtual_socs, manifest, model_config, socs, seq_len, workers, priority, out_dir,
            config_path) -> None:
    """Qualify a bundle: both KV updaters must agree on every SoC; JUnit + Markdown reports.

    Exit code: 0 all passed, 1 a case failed, 3 only infrastructure errors, 2 bad input.
    """
    from farm import bundle as bundle_mod
    from farm.devices import discover
    from farm.export import export_bundle
    from farm.pool import Pool, parse_priority
    from farm.qualify import ERROR, FAILED, Qualification, QualifyPlan, default_cases
    from farm.report import write_reports

    console = Console(stderr=True)
    prio = parse_priority(priority)
    if seq_len < 2:
        raise UsageError(f"--seq-len: must be at least 2, got {seq_len}")
    manifest_path = Path(manifest) if manifest else export_bundle(model_config)
    bundle = bundle_mod.load(manifest_path)
    started = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(out_dir) if out_dir else Path("reports") / f"qualify-{stamp}"

    with contextlib.ExitStack() as stack:
        if virtual_socs:
            from farm.virtual import VirtualDeviceSpec, VirtualFarm

            pairs = parse_soc_counts(virtual_socs, ())
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ptefarm-qualify-")))
            vf = stack.enter_context(VirtualFarm(home=tmp / "farm", adb_port=None))
            console.print(f"starting {sum(n for _, n in pairs)} virtual devices ...")
            vf.up([VirtualDeviceSpec(soc=soc) for soc, n in pairs for _ in range(n)])
            servers = [vf.adb_server]
            pool = stack.enter_context(Pool.open(f"sqlite:///{tmp / 'pool.db'}"))
        else:
            config = load_config(config_path)
            servers = config.adb_servers
            pool = stack.enter_context(Pool.from_config(config))
        infos = discover(servers)
        pool.sync(infos, servers)
        ready = [i for i in infos if i.soc and i.state == "device"]
        wanted = list(dict.fromkeys(s.upper() for s in socs)) or \
            sorted({i.soc for i in ready})
        if not wanted:
            raise UsageError("no device with a known SoC is attached: nothing to qualify "
                             "(try --virtual SM8650:2)")
        plan = QualifyPlan(manifest=manifest_path, socs=wanted,
                           cases=default_cases(bundle, seq_len), priority=prio)
        n_workers = workers or max(1, sum(1 for i in ready if i.soc in wanted))
        console.print(f"qualifying {bundle.name} on {', '.join(wanted)}: {len(plan.cases)} cases per "
                      f"SoC, {n_workers} workers")

        def show(r) -> None:
            colour = {"passed": "green", "failed": "red"}.get(r.outcome, "yellow")
            note = f"  ({r.message})" if r.outcome != "passed" else ""
            console.print(f"[{colour}]{r.outcome:6}[/] " + escape(f"{r.soc} {r.serial or '-'} "
                                                                   f"{r.case.id}{note}"))

        results = Qualification(plan, pool, servers, workers=n_workers, on_result=show).run()
        meta = {"bundle": str(manifest_path), "socs": wanted,
                "devices": sorted({r.serial for r in results if r.serial}),
                "wall_s": time.monotonic() - started, "workers": n_workers, "priority": prio}
        written = write_reports(results, out, meta)

    table = Table(title=f"qualification of {bundle.name}")
    for col in ("SoC", "device", "mode", "prompt", "outcome", "SM tok/s", "SP tok/s"):
        table.add_column(col, no_wrap=True)
    for r in results:
        sm, sp = r.tok_s.get("SmartMask"), r.tok_s.get("ShiftPointer")
        table.add_row(r.soc, r.serial or "-", r.case.mode, escape(r.case.name), r.outcome,
                      f"{sm:.1f}" if sm else "-", f"{sp:.1f}" if sp else "-")
    Console().print(table)
    click.echo(f"reports: {written}")
    if any(r.outcome == FAILED for r in results):
        sys.exit(1)
    if any(r.outcome == ERROR for r in results):
        sys.exit(3)
