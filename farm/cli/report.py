"""`farm report`: reports of runs.

    farm report RUN [--compare BASELINE] [--out DIR] [--format html|markdown|pytorch-benchmark-v3]
    farm report recover OUT_DIR

RUN is a report directory, a results.json, or a run id of the results store. BASELINE is any of
those, or a baseline's name (``farm baseline set RUN --name v1.0``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from farm.errors import FarmError, UsageError
from farm.fileio import write_atomic
from farm.results.jsonfile import load_results
from farm.results.records import QualificationResults

FORMATS = ("html", "markdown", "pytorch-benchmark-v3")
FILE_NAMES = {"html": "report.html", "markdown": "report.md", "pytorch-benchmark-v3": "benchmark-v3.json"}


class _ReportGroup(click.Group):
    """``farm report RUN`` is ``farm report render RUN``: a first argument that is not a sub-command
    is a run."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["render", *args]
        return super().parse_args(ctx, args)


@click.group("report", cls=_ReportGroup)
def report() -> None:
    """Reports of runs: `farm report RUN [--compare BASELINE]` writes the release qualification report
    (HTML and Markdown, or the PyTorch benchmark v3 records); `farm report recover DIR` writes the
    report of a killed run from its journal."""


# -- finding runs -------------------------------------------------------------------------------------

def open_store(config_path: str | None = None) -> Any:
    """The results store in the configured pool's database (farm.results.store)."""
    from farm.config import load_config
    from farm.results.store import ResultsStore, results_url

    return ResultsStore.open(results_url(load_config(config_path)))


def _run_at(source: str, what: str, config_path: str | None,
            stored: Callable[[Any], QualificationResults]) -> QualificationResults:
    """The run ``source`` names: a report directory or a results.json where the path exists (it wins
    over a run id or a baseline name spelt the same), else ``stored(store)`` of the results store."""
    path = Path(source)
    if path.is_dir():
        if not (path / "results.json").is_file():
            raise UsageError(f"{what} {source}: a directory without results.json (not a report directory)")
        return load_results(path / "results.json")
    if path.is_file():
        return load_results(path)
    with open_store(config_path) as store:
        return stored(store)


def load_run(source: str, *, config_path: str | None = None, what: str = "RUN") -> QualificationResults:
    """A run from a report directory, a results.json or a run id of the results store."""
    def by_id(store: Any) -> QualificationResults:
        try:
            return store.load_run(source)
        except UsageError as e:
            raise UsageError(f"{what} {source!r}: no such report directory or results.json, and {e}") from None
    return _run_at(source, what, config_path, by_id)


def load_baseline(source: str, *, config_path: str | None = None, what: str = "--compare") -> QualificationResults:
    """A baseline: anything ``load_run`` takes, or the name of a baseline in the results store."""
    def by_name_or_id(store: Any) -> QualificationResults:
        try:
            run = store.baseline(source)
        except UsageError as by_name:
            try:
                return store.load_run(source)
            except UsageError:
                raise UsageError(f"{what} {source!r}: not a report directory, results.json or stored "
                                 f"run, and {by_name}") from None
        run.meta = {**run.meta, "baseline_name": source}
        return run
    return _run_at(source, what, config_path, by_name_or_id)


def latest_baseline(bundle: str, *, config_path: str | None = None,
                    timings: frozenset[str] | None = None) -> QualificationResults | None:
    """The newest named baseline of ``bundle`` in the results store whose figures have ``timings``
    (None: any); None without one."""
    with open_store(config_path) as store:
        found = store.latest_baseline(bundle, timings=timings)
    if found is None:
        return None
    info, run = found
    run.meta = {**run.meta, "baseline_name": info.name}
    return run


def default_baseline(name: str | None, purpose: str, bundle: str, config_path: str | None, *,
                     who: str = "farm", timings: frozenset[str] | None = None) -> QualificationResults | None:
    """The run the gate compares with: ``--baseline`` (a name, run id or report), else for release and
    nightly runs the latest named baseline of the bundle whose figures have ``timings`` (the run's:
    simulated, host-CPU and measured figures never have one another for a baseline); None for no
    gate."""
    if name is not None:
        return None if name == "none" else load_baseline(name, config_path=config_path, what="--baseline")
    if purpose in ("release", "nightly"):
        found = latest_baseline(bundle, config_path=config_path, timings=timings)
        if found is None:
            which = f" with {'/'.join(sorted(t or 'unknown' for t in timings))} figures" if timings else ""
            click.echo(f"{who}: no named baseline for bundle {bundle!r}{which}: throughput is checked "
                       "against the thresholds only", err=True)
        return found
    return None


# -- writing ------------------------------------------------------------------------------------------

@dataclass
class Written:
    paths: dict[str, Path]
    exit_code: int
    markdown: str
    headline: str = ""


def write_outputs(run: QualificationResults, baseline: QualificationResults | None, out_dir: Path, formats: tuple[str, ...],
                  *, min_effect: float = 0.05, inconclusive_fails: bool = False,
                  history: tuple[str, list] | None = None, evidence_dir: Path | None = None) -> Written:
    """Evaluate the gate and write each format into ``out_dir``, every file atomically (a temp file
    renamed into place: an interrupted write leaves the old file or none, never half of one).
    ``evidence_dir``: the run's report directory, which its records' evidence paths are relative to
    (the page folds in excerpts of failed tests' evidence read there; None: linked only)."""
    from farm.report.markdown import render_markdown
    from farm.report.qualification import qualification_report
    from farm.results.gate import GateConfig, evaluate

    gate = evaluate(run, baseline, GateConfig(min_effect=min_effect, inconclusive_fails=inconclusive_fails))
    q = qualification_report(run, baseline, gate)
    if history is not None:
        q.trends_of, q.trends = history
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    markdown = render_markdown(q)
    for fmt in formats:
        path = out_dir / FILE_NAMES[fmt]
        if fmt == "markdown":
            text = markdown
        elif fmt == "html":
            from farm.report.html import render_html

            text = render_html(q, evidence_dir)
        else:
            from farm.report.benchmark_v3 import records

            text = json.dumps(records(run, gate), indent=2, ensure_ascii=False) + "\n"
        write_atomic(path, text)
        paths[fmt] = path
    title, sentence = q.headline
    return Written(paths, int(q.exit_code), markdown, f"{title}: {sentence}")


def history_of(run: QualificationResults, *, config_path: str | None = None, limit: int = 60,
               plot: bool = True) -> tuple[str, list] | None:
    """The trends of ``run``'s points over the stored runs of its purpose and bundle (the run itself
    included, once stored), for the report; None when the store cannot be read (the report is
    written without them: a history is context, never part of a verdict)."""
    from farm.report.trends import trends

    purpose, bundle = run.meta.get("purpose"), run.meta.get("bundle_name")
    if purpose not in ("nightly", "release") or not bundle:
        return None
    try:
        with open_store(config_path) as store:
            series = store.point_series(purpose=purpose, bundle=bundle, limit=limit)
    except (FarmError, OSError) as e:
        click.echo(f"farm: no trends in the report: the results store cannot be read ({e})", err=True)
        return None
    if not any(len(s.runs) > 1 for s in series):
        return None  # one run is no trend
    return f"the last {max(len(s.runs) for s in series)} {purpose} run(s) of {bundle}", trends(series, plot=plot)


def parse_percent(value: str) -> float:
    try:
        pct = float(value.rstrip("%"))
    except ValueError:
        raise UsageError(f"--min-effect: {value!r} is not a percentage") from None
    if not 0 <= pct < 100:
        raise UsageError(f"--min-effect: must be in [0, 100), got {value}")
    return pct / 100


def gate_options(f):
    f = click.option("--min-effect", "min_effect", default="5", show_default=True, metavar="PCT",
                     help="smallest change of a median (percent) the regression gate calls a "
                          "regression or an improvement")(f)
    return click.option("--inconclusive", type=click.Choice(["pass", "fail"]), default="pass",
                        show_default=True, help="whether a point the gate cannot decide (too few or "
                                                "too noisy samples) fails the gate")(f)


@report.command("render")
@click.argument("run")
@click.option("--compare", "compare", metavar="BASELINE", default=None,
              help="baseline: a report directory, results.json, stored run id or baseline name")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="where to write [default: RUN's report directory, else reports/run-<id>]")
@click.option("--format", "formats", type=click.Choice(FORMATS), multiple=True,
              help="repeatable [default: html and markdown]")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="farm config, for the results store [default: $PTEFARM_CONFIG or ./farm.toml]")
@gate_options
def render(run: str, compare: str | None, out_dir: str | None, formats: tuple[str, ...], config_path: str | None,
           min_effect: str, inconclusive: str) -> None:
    """Write the release qualification report of RUN (HTML page and Markdown summary), or its
    PyTorch benchmark v3 records. Prints each file written; the HTML page's path last.

    Exit code: the run's, combined with the regression gate (1 test failure > 4 regression >
    2 bad input > 3 infrastructure > 0)."""
    import sys

    results = load_run(run, config_path=config_path)
    baseline = load_baseline(compare, config_path=config_path) if compare else None
    if out_dir is None:
        path = Path(run)
        out = path if path.is_dir() else path.parent if path.is_file() else \
            Path("reports") / f"run-{results.meta.get('run_id', run)}"
    else:
        out = Path(out_dir)
    order = formats or ("markdown", "html")
    path = Path(run)
    run_dir = path if path.is_dir() else path.parent if path.is_file() else None
    written = write_outputs(results, baseline, out, tuple(sorted(set(order), key=lambda f: f == "html")),
                            min_effect=parse_percent(min_effect), inconclusive_fails=inconclusive == "fail",
                            evidence_dir=run_dir)
    for fmt, path in written.paths.items():
        click.echo(f"{fmt}: {path}" if fmt != "html" else str(path))
    if written.exit_code:
        click.echo(f"farm: {written.headline}", err=True)  # why the code is not 0, in one line
    sys.exit(written.exit_code)


@report.command("recover")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="farm config whose pool database keeps the results [default: $PTEFARM_CONFIG or "
                   "./farm.toml]")
@click.option("--results-url", "store_url", metavar="URL|none", default=None,
              help="save the recovered run to this results store instead ('none': do not save it), "
                   "as the run's --farm-results-url would have")
@click.option("--run", "run_id", metavar="RUN_ID", default=None,
              help="the run to recover when journals of several runs are beside OUT_DIR (two runs are "
                   "never merged into one report)")
def recover(out_dir: str, config_path: str | None, store_url: str | None, run_id: str | None) -> None:
    """Write the report of a run that was killed before it could (SIGKILL, host crash), from the
    journal it kept as tests finished, and save it to the results store as a finished run is
    (``farm history``). Report and stored run are marked partial. A report already in OUT_DIR is
    kept: the recovered one is then written beside it (OUT_DIR.recovered-RUN_ID).

    Exit code: 0 done; with the report written but the run not saved, 3 (the database is down) or 2
    (the journal lacks what a stored run needs, e.g. its meta).
    """
    import sys

    from farm.config import load_config
    from farm.errors import FarmError
    from farm.exitcodes import for_error
    from farm.report.directory import recover as recover_report
    from farm.results.store import ResultsStore, results_url

    written = recover_report(Path(out_dir), run_id)
    click.echo(f"recovered report: {written}")
    if store_url == "none":
        return
    # What the report holds, meta completed (verdict, partial): the stored run is the report's run.
    # The report comes first, as at the end of a run: a database that is down never costs it.
    run = load_run(str(written))
    try:
        with ResultsStore.open(store_url or results_url(load_config(config_path))) as store:
            store.save_run(run)
            click.echo(f"results stored: run {run.meta.get('run_id')} (partial) in {store.where} "
                       "(farm history)")
    except FarmError as e:
        click.echo(f"farm report recover: run {run.meta.get('run_id', '?')} not saved to the results "
                   f"store: {e} (the report in {written} is complete)", err=True)
        sys.exit(for_error(e))


@report.command("merge")
@click.argument("sources", nargs=-1, metavar="[DIR|RESULTS.JSON|RUN]...")
@click.option("--group", "group_id", metavar="ID", default=None,
              help="take the group's shard runs from the results store too (the newest run of each "
                   "shard not given as a SOURCE)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="report directory of the group run [default: reports/group-<ID>]")
@click.option("--baseline", "baseline_name", metavar="NAME", default=None,
              help="baseline for the regression gate: a name, stored run id, report directory or "
                   "results.json [default for release/nightly: the latest named baseline of the "
                   "bundle; 'none' for no gate]")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="farm config, for the results store [default: $PTEFARM_CONFIG or ./farm.toml]")
@click.option("--results-url", "store_url", metavar="URL|none", default=None,
              help="save the group run to this results store [default: the config's]; 'none' saves "
                   "nothing")
@gate_options
def merge(sources: tuple[str, ...], group_id: str | None, out_dir: str | None, baseline_name: str | None,
          config_path: str | None, store_url: str | None, min_effect: str, inconclusive: str) -> None:
    """Merge the shard runs of one group (`farm qualify --shard K/N --group ID`) into one run: one
    release report (report.html, report.md, junit/<device>.xml, summary.md, results.json,
    benchmark-v3.json) with one verdict over every shard, stored as run group-ID. A shard that is
    missing, or the tests a shard never reached, are infrastructure errors in it, named; shards of
    different runs (bundle, revision, plan) or a test in two shards are refused.

    Exit code: as farm qualify's, over the whole group (3 when a shard is missing and nothing
    failed)."""
    import shutil
    import sys

    from farm.exitcodes import ExitCode
    from farm.report.directory import check_out_dir, lock_out_dir, write_reports
    from farm.results.group import Shard, merge as merge_shards
    from farm.results.shards import check_group_id

    effect = parse_percent(min_effect)
    if not sources and group_id is None:
        raise UsageError("farm report merge: give the shards' report directories (or results.json, or "
                         "stored run ids), or --group ID to take them from the results store")
    if group_id is not None:
        check_group_id(group_id, "--group")
    shards = [Shard(source, load_run(source, config_path=config_path, what="SOURCE")) for source in sources]
    if group_id is not None:
        shards += _stored_shards(group_id, shards, config_path)
    merged = merge_shards(shards)
    meta = merged.run.meta
    out = Path(out_dir) if out_dir else Path("reports") / meta["run_id"]
    check_out_dir(out, make_parents=out_dir is None)
    from farm.results.gate import figure_timings

    baseline = default_baseline(baseline_name, str(meta.get("purpose") or "adhoc"),
                                str(meta.get("bundle_name") or ""), config_path, who="farm report merge",
                                timings=figure_timings(merged.run))
    with lock_out_dir(out, meta["run_id"]):
        write_reports(merged.run.records, out, {**meta, "report_dir": str(out.absolute())})
        for s in shards:  # each test's device evidence, under the same relative path as in its shard
            where = Path(s.source)
            evidence = (where if where.is_dir() else where.parent) / "evidence"
            if where.exists() and evidence.is_dir():
                shutil.copytree(evidence, out / "evidence", dirs_exist_ok=True)
        merged.run = load_run(str(out))  # as written: meta completed (written_at, units)
        stored = False
        if store_url != "none":  # before the pages: the group run is then in the trends they draw
            try:
                with open_store_at(store_url, config_path) as store:
                    store.save_run(merged.run)
                    stored = True
                    click.echo(f"results stored: run {meta['run_id']} in {store.where} (farm history)",
                               err=True)
            except FarmError as e:
                click.echo(f"farm report merge: run {meta['run_id']} not saved to the results store: "
                           f"{e} (the report in {out} is complete)", err=True)
        history = history_of(merged.run, config_path=config_path) if stored and store_url is None else None
        written = write_outputs(merged.run, baseline, out, ("markdown", "pytorch-benchmark-v3", "html"),
                                min_effect=effect, inconclusive_fails=inconclusive == "fail",
                                history=history, evidence_dir=out)
    group = meta["group"]
    for s in group["shards"]:
        click.echo(f"shard {s['shard']}/{group['of']}: run {s['run_id']} from {s['source']}: "
                   f"{s['tests']} test(s), {s['verdict']}"
                   + (f", {s['unfinished']} planned test(s) without a result" if s["unfinished"] else ""),
                   err=True)
    for i in merged.missing:
        click.echo(f"farm report merge: shard {i}/{group['of']} of group {group['id']} is MISSING: its "
                   f"{len(group['plan'][i - 1])} test(s) are infrastructure errors in the report", err=True)
    code = written.exit_code
    if store_url != "none" and not stored:
        code = code or ExitCode.INFRA
    for fmt, path in written.paths.items():
        click.echo(f"{fmt}: {path}" if fmt != "html" else str(path))
    if code:
        click.echo(f"farm: {written.headline}", err=True)
    sys.exit(code)


def open_store_at(url: str | None, config_path: str | None) -> Any:
    if url is None:
        return open_store(config_path)
    from farm.results.store import ResultsStore

    return ResultsStore.open(url)


def _stored_shards(group_id: str, given: list, config_path: str | None) -> list:
    """The newest stored run of each shard of ``group_id`` that ``given`` lacks (a CI job re-run
    leaves an older attempt behind: it is named, not merged)."""
    from farm.results.group import Shard

    have = {r.run.meta.get("run_id") for r in given}
    have_shards = {str(r.run.meta.get("group", {}).get("shard")) for r in given}
    picked: dict[str, Any] = {}
    with open_store(config_path) as store:
        for summary in store.list_runs(limit=None, group=group_id):  # newest first
            if not summary.shard or summary.run_id in have:
                continue
            index = summary.shard.split("/")[0]
            if index in have_shards:
                continue
            if index in picked:
                click.echo(f"farm report merge: shard {summary.shard}: run {summary.run_id} left out, "
                           f"run {picked[index].run.meta['run_id']} is newer", err=True)
                continue
            picked[index] = Shard(f"stored run {summary.run_id}", store.load_run(summary.run_id))
    if not picked and not given:
        raise UsageError(f"--group {group_id}: no shard run of that group in the results store")
    return list(picked.values())
