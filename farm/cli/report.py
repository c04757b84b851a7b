"""`farm report`: reports of runs."""

from __future__ import annotations

from pathlib import Path

import click


@click.group("report")
def report() -> None:
    """Reports of runs (JUnit per device, summary.md, results.json)."""


@report.command("recover")
@click.argument("out_dir", type=click.Path(file_okay=False))
def recover(out_dir: str) -> None:
    """Write the report of a run that was killed before it could (SIGKILL, host crash), from the
    journal it kept as tests finished. The report is marked partial."""
    from farm.report import recover as recover_report

    written = recover_report(Path(out_dir))
    click.echo(f"recovered report: {written}")
