"""`farm chaos`: the fault matrix on virtual devices, as a table (see farm.selftest.chaos)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from farm.cli.progress import console as cli_console


@click.command()
@click.option("--only", "only", multiple=True, metavar="NAME",
              help="run only these scenarios (repeatable); see --list")
@click.option("--list", "list_only", is_flag=True, help="list the scenarios and exit")
@click.option("--bundle", "manifest", type=click.Path(dir_okay=False), default=None,
              help="reference bundle manifest [default: exported tiny]")
@click.option("--keep", type=click.Path(file_okay=False), default=None,
              help="keep every scenario's lab (logs, reports, pool) in this directory")
@click.option("--markdown", is_flag=True, help="print the matrix as a Markdown table")
def chaos(only, list_only, manifest, keep, markdown) -> None:
    """Inject real faults into runs on virtual devices and check the farm tells the truth.

    Exit code 0 when every scenario survived with no result lost, 1 otherwise.
    """
    from farm.errors import UsageError
    from farm.selftest.chaos import SCENARIOS, chaos_dir, run_scenario

    if list_only:
        for s in SCENARIOS:
            click.echo(f"{s.name:22} {s.fault}")
        return
    names = list(only) or [s.name for s in SCENARIOS]
    known = {s.name for s in SCENARIOS}
    if unknown := [n for n in names if n not in known]:
        raise UsageError(f"--only: unknown scenario {unknown[0]!r} (see farm chaos --list)")
    if manifest is None:
        from farm.bundle.export import export_bundle

        manifest = export_bundle("tiny")
    table = Table(title="farm chaos", show_lines=True)
    for col in ("fault", "injected how", "expected", "observed", "survived", "results lost"):
        table.add_column(col, overflow="fold")
    err = Console(stderr=True)
    all_ok = True
    rows: list[tuple[str, ...]] = []
    with chaos_dir(Path(keep) if keep else None) as root:
        for s in (s for s in SCENARIOS if s.name in names):
            err.print(f"[bold]{s.name}[/] ...")
            obs = run_scenario(s.name, root / s.name, Path(manifest))
            ok = obs.survived and obs.lost == 0
            all_ok &= ok
            if not ok:
                err.print(f"  [red]not survived:[/] {'; '.join(obs.failed_checks()) or obs.observed}")
            rows.append((s.fault, s.injected, s.expected, obs.observed,
                         "yes" if obs.survived else "NO", str(obs.lost)))
            table.add_row(*rows[-1])
    if markdown:
        click.echo("| fault | injected how | expected | observed | survived | results lost |")
        click.echo("|---|---|---|---|---|---:|")
        for row in rows:
            click.echo("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |")
    else:
        cli_console().print(table)
    sys.exit(0 if all_ok else 1)
