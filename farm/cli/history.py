"""``farm history``, ``farm baseline``, ``farm results``: the runs the results store keeps
(farm.results.store; the configured pool's database, or ``--url``).

    farm history --limit 20 --purpose release       # the latest runs first
    farm baseline set 20250101-120000-000001 --name v1.0
    farm baseline ls
    farm baseline show v1.0
    farm results prune                              # runs older than results.retention_days

A run or baseline that is not there is bad input (exit 2), named in the message.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from farm.cli.options import (config_option, farm_config, json_option, older_than_days, older_than_option,
                               pool_url_option)
from farm.cli.progress import console as cli_console
from farm.errors import UsageError
from farm.results.records import QualificationResults
from farm.results.store import Baseline, QualificationSummary, ResultsStore, results_url
from farm.vocab import PURPOSES


def _store_options(f):
    return config_option(pool_url_option(f))


def _open() -> ResultsStore:
    return ResultsStore.open(results_url(farm_config()))


def _console() -> Console:
    return cli_console()  # not a terminal (CI logs, pipes): whole lines, never cut at 80 columns


def _when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _tests(s: QualificationSummary) -> str:
    parts = [f"{s.passed} passed", f"{s.failed} failed", f"{s.errors} errors"]
    if s.skipped:
        parts.append(f"{s.skipped} skipped")
    return ", ".join(parts)


def _verdict(s: QualificationSummary) -> str:
    return s.verdict + (" (partial)" if s.partial else "")


def _devices(s: QualificationSummary) -> str:
    socs = sorted({d.split()[0] for d in s.devices})
    text = f"{len(s.devices)}: {', '.join(socs)}" if s.devices else "none"
    return text + (" (virtual)" if s.virtual else "")


def _history_table(runs: list[QualificationSummary]) -> Table:
    table = Table(title="runs (latest first)")
    for col in ("run", "started", "purpose", "bundle", "digest", "git", "verdict", "tests", "devices",
                "baseline"):
        table.add_column(col)
    for s in runs:
        table.add_row(s.run_id, s.started_at.replace("T", " "), s.purpose, s.bundle_name,
                      s.bundle_digest[:12], s.git_revision or "-", _verdict(s), _tests(s),
                      _devices(s), ", ".join(s.baselines))
    return table


@click.command("history")
@click.option("--limit", type=int, default=None,
              help="Runs to list [default: 20; with --changes, the last 200 runs].")
@click.option("--purpose", type=click.Choice(PURPOSES), default=None, help="Only runs of this purpose.")
@click.option("--bundle", default=None, metavar="NAME", help="Only runs of this bundle name.")
@click.option("--changes", is_flag=True,
              help="Find the runs where a point's throughput moved (change points over the history of "
                   "--purpose, nightly by default; --limit runs, 200 by default).")
@click.option("--min-effect", type=float, default=3.0, show_default=True,
              help="With --changes: the smallest step, in %.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="With --changes: write a trend plot per point (SVG) and an index.html here.")
@json_option
@_store_options
def history(limit: int | None, purpose: str | None, bundle: str | None, changes: bool, min_effect: float,
            plot_dir: str | None, as_json: bool) -> None:
    """The runs in the results store, the latest first: verdict, tests, devices, bundle, git.

    With --changes: the change points of every point's throughput over the history instead."""
    if limit is not None and limit < 1:
        raise UsageError(f"--limit: must be >= 1, got {limit}")
    if changes:
        _changes(limit or 200, purpose or "nightly", bundle, min_effect / 100, plot_dir, as_json)
        return
    limit = limit or 20
    if plot_dir is not None:
        raise UsageError("--plot: only with --changes")
    with _open() as store:
        runs = store.list_runs(limit=limit, purpose=purpose, bundle=bundle)
        where = store.where
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in runs], indent=2))
        return
    if not runs:
        click.echo(f"no runs in the results store at {where}"
                   + (" matching the filters" if purpose or bundle else ""))
        return
    _console().print(_history_table(runs))


def _changes(limit: int, purpose: str, bundle: str | None, min_effect: float, plot_dir: str | None,
             as_json: bool) -> None:
    from farm.report.trends import trends

    with _open() as store:
        series = store.point_series(purpose=purpose, bundle=bundle, limit=limit)
    found = trends(series, min_effect=min_effect, plot=plot_dir is not None)
    if plot_dir is not None:
        _plot_trends(Path(plot_dir), found)
    if as_json:
        click.echo(json.dumps({"purpose": purpose, "points": [
            {"point": t.label, "timing": t.timing, "runs": t.runs,
             "changes": [c.to_json() for c in t.changes]} for t in found]}, indent=2))
        return
    if not series:
        click.echo(f"no measurements in {purpose} runs" + (f" of bundle {bundle}" if bundle else ""))
        return
    table = Table(title=f"change points over the last {limit} {purpose} run(s)")
    for col in ("point", "runs", "run", "before", "after", "change", "p"):
        table.add_column(col)
    for t in found:
        for c in t.changes or [None]:
            table.add_row(t.label, str(t.runs), *(["-"] * 5 if c is None else [
                c.run_id, _num(c.before), _num(c.after), f"{c.delta:+.1%}", f"{c.p_value:.1g}"]))
    _console().print(table)


def _plot_trends(out: Path, found) -> None:
    import html

    from farm.fileio import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    parts = ["<!doctype html><meta charset=utf-8><title>throughput trends</title>",
             "<h1>Throughput per point over history</h1>"]
    for i, t in enumerate(found):
        if t.svg is None:
            continue
        write_atomic(out / f"trend-{i:03d}.svg", t.svg)
        parts.append(f"<h2>{html.escape(t.label)}</h2>{t.svg}")
    write_atomic(out / "index.html", "\n".join(parts))


# -- baselines ----------------------------------------------------------------------------------------

@click.group("baseline")
def baseline() -> None:
    """Named runs to compare against (farm report RUN --compare NAME, the regression gate)."""


def _who() -> str:
    from farm.pool import Holder

    h = Holder.current()
    return f"{h.user}@{h.host}" + (f" job {h.ci_job}" if h.ci_job else "")


@baseline.command("set")
@click.argument("run_id", metavar="RUN")
@click.option("--name", required=True, help="The baseline's name, e.g. v1.0 (an existing name moves).")
@_store_options
def baseline_set(run_id: str, name: str) -> None:
    """Name stored run RUN as baseline NAME; a named run is never pruned."""
    with _open() as store:
        before = store.set_baseline(name, run_id, created_by=_who())
    moved = f" (was run {before})" if before and before != run_id else ""
    click.echo(f"baseline {name}: run {run_id}{moved}")


@baseline.command("ls")
@json_option
@_store_options
def baseline_ls(as_json: bool) -> None:
    """Every named baseline, the newest first."""
    with _open() as store:
        names = store.baselines()
        runs = {s.run_id: s for s in store.list_runs(limit=None,
                                                     run_ids=sorted({b.run_id for b in names}))}
    if as_json:
        click.echo(json.dumps([b.to_dict() for b in names], indent=2))
        return
    if not names:
        click.echo("no baselines: name one with 'farm baseline set RUN --name NAME'")
        return
    table = Table(title="baselines")
    for col in ("name", "run", "named", "by", "bundle", "verdict", "started"):
        table.add_column(col)
    for b in names:
        s = runs.get(b.run_id)
        table.add_row(b.name, b.run_id, _when(b.created), b.created_by, s.bundle_name if s else "?",
                      _verdict(s) if s else "?", s.started_at.replace("T", " ") if s else "?")
    _console().print(table)


def _num(v: float) -> str:
    return f"{v:.2f}" if v == 0 or 0.01 <= abs(v) < 1e6 else f"{v:.3g}"


def _points(run: QualificationResults) -> Table:
    table = Table(title="measurements (every measured run)")
    for col in ("soc", "metric", "mode", "seq_len", "updater", "n", "median", "min", "max",
                "threshold", "unit"):
        table.add_column(col)
    for r in run.records:
        for m in r.measurements:
            values = m.values or [math.nan]
            table.add_row(r.soc or "-", m.metric, m.mode or "-", str(m.seq_len or "-"),
                          m.updater or "-", str(len(m.values)), _num(statistics.median(values)),
                          _num(min(values)), _num(max(values)),
                          "-" if m.threshold is None else f"{m.threshold:g}", m.unit)
    return table


def _show(info: Baseline, run: QualificationResults) -> None:
    meta = run.meta
    counts: dict[str, int] = {}
    for r in run.records:
        label = "errors" if r.outcome == "error" else str(r.outcome)
        counts[label] = counts.get(label, 0) + 1
    click.echo(f"baseline {info.name}: run {info.run_id}, named {_when(info.created)}"
               + (f" by {info.created_by}" if info.created_by else ""))
    click.echo(f"  bundle {meta.get('bundle_name', '?')} (sha256 {str(meta.get('bundle_digest', ''))[:16]}, "
               f"dialect {meta.get('runner_dialect', '?')}), git {meta.get('git_revision') or 'unknown'}")
    click.echo(f"  {meta.get('purpose', 'adhoc')} run started {meta.get('started_at', '?')}, verdict "
               f"{meta.get('verdict', '?')}{' (partial)' if meta.get('partial') else ''}"
               f"{', virtual devices' if meta.get('virtual') else ''}")
    click.echo("  tests: " + (", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "none"))
    if any(r.measurements for r in run.records):
        _console().print(_points(run))


@baseline.command("show")
@click.argument("name")
@json_option
@_store_options
def baseline_show(name: str, as_json: bool) -> None:
    """The run baseline NAME names: its verdict, tests and every measurement."""
    with _open() as store:
        info = store.baseline_info(name)
        run = store.load_run(info.run_id)
    if as_json:
        click.echo(json.dumps({"baseline": info.to_dict(), "meta": run.meta,
                               "results": [r.to_json() for r in run.records]}, indent=2))
        return
    _show(info, run)


# -- retention ----------------------------------------------------------------------------------------

@click.group("results")
def results() -> None:
    """The results store itself."""


@results.command("prune")
@older_than_option("Delete runs that started longer ago than this [default: the config's "
                   "results.retention_days, 180].")
@_store_options
def results_prune(days: float | None) -> None:
    """Delete old runs with their tests and measurements; named baselines are kept."""
    config = farm_config()
    days = older_than_days(days, config.results.retention_days)
    with ResultsStore.open(results_url(config)) as store:
        pruned = store.prune(days)
    click.echo(f"pruned {len(pruned)} run(s) older than {days:g} day(s)"
               + (f": {', '.join(pruned)}" if pruned else ""))

