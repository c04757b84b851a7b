"""`farm qualify`: the main job. The farm's suites (suites/) run through pytest and the ptefarm plugin,
in parallel on every device (pytest-xdist, one worker per device), with reports written at the end.

It is a thin front: everything it does is a pytest run a user could type, which it prints first.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import click
import pluggy

from farm.cli.report import (
    default_baseline,
    gate_options,
    history_of,
    load_run,
    parse_percent,
    write_outputs,
)
from farm.errors import UsageError
from farm.report.directory import check_out_dir, lock_out_dir
from farm.vocab import PURPOSES


def suites_dir() -> Path:
    import ptefarm_suites

    return Path(ptefarm_suites.__file__).resolve().parent


def _device_count(virtual: tuple[str, ...], socs: tuple[str, ...], config_path: str | None) -> int:
    """Workers to start: one per device that can serve the run."""
    from farm.config import load_config
    from farm.session import open_farm, parse_soc_counts

    if virtual:
        pairs = parse_soc_counts(virtual)
        wanted = {s.upper() for s in socs}
        return sum(n for soc, n in pairs if not wanted or soc in wanted)
    with open_farm(load_config(config_path), watch=False) as farm:  # the plugin keeps it fresh
        picked = farm.pick_socs(socs)
        return sum(n for soc, n in farm.inventory().items() if soc in picked)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--virtual", "virtual_socs", multiple=True, metavar="SOC[:N]",
              help="run on fresh virtual devices (repeatable: --virtual SM8650:2 --virtual SM8550) "
                   "with a private adb server and pool, all stopped at the end")
@click.option("--virtual-timing", type=click.Choice(["host", "phone"]), default=None,
              help="the --virtual devices' timing: host (the host CPU's figures) or phone (a simulated "
                   "phone's, marked SIMULATED) [default: the config's virtual.timing]")
@click.option("--bundle", "manifest", type=click.Path(dir_okay=False), default=None,
              help="bundle manifest to qualify [default: the exported reference bundle]")
@click.option("--model", "model_config", default="tiny", show_default=True,
              help="reference config to export when no --bundle is given")
@click.option("--soc", "socs", multiple=True, help="SoCs to qualify [default: every SoC in the pool]")
@click.option("--workers", type=int, default=None,
              help="parallel pytest workers [default: one per device]")
@click.option("--priority", default="release", show_default=True,
              help="lease priority: release, nightly, pr, adhoc or a number")
@click.option("--retries", type=int, default=2, show_default=True,
              help="re-runs of a test spoiled by the infrastructure, on another device")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="report directory [default: reports/qualify-<time>]")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="farm config file [default: $PTEFARM_CONFIG or ./farm.toml]")
@click.option("--purpose", type=click.Choice(PURPOSES), default="adhoc", show_default=True,
              help="why this run is made (kept with its results; release and nightly compare against "
                   "the latest named baseline by default)")
@click.option("--baseline", "baseline_name", metavar="NAME", default=None,
              help="baseline for the regression gate: a baseline name, stored run id, report directory "
                   "or results.json [default for release/nightly: the latest named baseline of the "
                   "bundle, if any; 'none' for no gate]")
@click.option("--ab-baseline", "ab_baseline", type=click.Path(dir_okay=False), default=None,
              metavar="MANIFEST",
              help="a baseline bundle (the main branch's build) to A/B the bundle against on the same "
                   "devices: the throughput suite's test_against_baseline_bundle fails when the bundle "
                   "is slower")
@click.option("--shard", "shard", metavar="K/N", default=None,
              help="run shard K of N of the selected tests (a SoC's tests stay in one shard unless "
                   "--shard-by test); every shard of the run takes the same --group, and `farm report "
                   "merge` makes them one run")
@click.option("--group", "group_id", metavar="ID", default=None,
              help="the id the shards of one run share (a CI run's id); the merged run is group-ID")
@click.option("--shard-by", "shard_by", type=click.Choice(["soc", "test"]), default=None,
              help="how shards split the tests [default: soc]")
@click.option("--dist", "dist", type=click.Choice(["soc", "each"]), default=None,
              help="each: run every test on every device of each SoC (a bad unit is found; the report "
                   "shows the spread of throughput across a SoC's units and flags an outlier) "
                   "[default: soc, once per SoC]")
@gate_options
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def qualify(virtual_socs, virtual_timing, manifest, model_config, socs, workers, priority, retries, out_dir,
            config_path, purpose, baseline_name, ab_baseline, shard, group_id, shard_by, dist, min_effect,
            inconclusive, pytest_args) -> None:
    """Qualify a bundle with the farm's suites (smoke, correctness, throughput) on every SoC, and
    write the release qualification report (report.html, report.md) beside the JUnit files.

    Arguments after the options go to pytest: `farm qualify --virtual SM8650 -- -m gate -k story`.
    pytest runs without the plugins the environment installs that the suites never use (hypothesis,
    hydra, anyio, kgb: seconds of start-up per worker); `-- -p anyio` loads one back.
    The last line printed is the HTML report's path.

    Exit code: 0 all passed, 1 a test failed, 4 throughput regressed against the baseline (no test
    failed), 3 only infrastructure errors, 2 bad input, 130 interrupted (a partial report is written).
    A report directory that cannot be written (missing parent, read-only, too little room) or that
    another run is writing is bad input (2) before any device is leased; a report that could not be
    written to it at the end goes to a fallback directory named on stderr (exit 3 if all passed).
    """
    if workers is not None and workers < 0:
        raise UsageError(f"--workers: must be >= 0, got {workers}")
    effect = parse_percent(min_effect)  # bad input first, before any export or device
    sharding: list[str] = []
    if shard is not None:
        from farm.results.shards import parse_shard

        spec = parse_shard(shard, group_id, shard_by, flag="--shard")
        sharding = ["--farm-shard", spec.label, "--farm-group", spec.group, "--farm-shard-by", spec.by]
    elif group_id is not None or shard_by is not None:
        raise UsageError("--group and --shard-by are for a shard's run: give --shard K/N")
    if dist is not None:
        sharding += ["--farm-dist", dist]
    if manifest is None:
        from farm.bundle.export import export_bundle
        from farm.model.config import VLM_CONFIGS

        if model_config in VLM_CONFIGS:  # the vision-language reference (farm/bundle/export_vlm.py)
            from farm.bundle.export_vlm import export_bundle
        manifest = str(export_bundle(model_config))
    from farm.bundle.manifest import load

    bundle = load(manifest)  # bad input first, before any device is counted or started
    if ab_baseline is not None:
        load(ab_baseline)
    # A baseline named is loaded now (bad input before any device); the default one once the run's
    # figures say their timing (farm.results.gate.figure_timings).
    baseline = (default_baseline(baseline_name, purpose, bundle.name, config_path, who="farm qualify")
                if baseline_name is not None else DEFAULT_BASELINE)
    out = Path(out_dir) if out_dir else Path("reports") / f"qualify-{time.strftime('%Y%m%d-%H%M%S')}"
    # The report directory before any device is counted, started or leased (bad input: exit 2), and
    # held for the whole command: the plugin's run, then report.html and report.md (the plugin takes
    # the same lock again in this process). The default's reports/ is made; a given --out's parent
    # must exist (a typo there is refused rather than made).
    check_out_dir(out, make_parents=out_dir is None)
    with lock_out_dir(out):
        _qualify(out, virtual_socs, manifest, socs, workers, priority, retries, config_path, purpose,
                 baseline, effect, inconclusive, [*sharding, *pytest_args], ab_baseline, virtual_timing)


def _qualify(out, virtual_socs, manifest, socs, workers, priority, retries, config_path, purpose,
             baseline, effect, inconclusive, pytest_args, ab_baseline=None, virtual_timing=None) -> None:
    import pytest

    from farm.exitcodes import ExitCode

    n = workers if workers is not None else _device_count(virtual_socs, socs, config_path)
    args = [str(suites_dir()), "-p", "no:cacheprovider", "-p", "no:randomly",
            *unrelated_plugin_args(), "-ra", "--farm-bundle", str(manifest), "--farm-out", str(out), "--farm-priority", str(priority),
            "--farm-retries", str(retries)]
    args += ["-n", str(n)] if n > 1 else ["-p", "no:xdist"]
    for v in virtual_socs:
        args += ["--farm-virtual", v]
    if virtual_timing is not None:
        args += ["--farm-virtual-timing", virtual_timing]
    for s in socs:
        args += ["--farm-soc", s]
    if config_path:
        args += ["--farm-config", config_path]
    args += ["--farm-purpose", purpose]
    if ab_baseline is not None:
        args += ["--farm-ab-baseline", str(ab_baseline)]
    args += list(pytest_args)
    click.echo("+ pytest " + shlex.join(args), err=True)
    where = _ReportWhere()
    code = pytest.main(args, plugins=[where])
    # Where the plugin wrote the report: out, or the fallback it named on stderr when out's file
    # system filled during the run.
    report_dir = where.written or out
    if code == pytest.ExitCode.USAGE_ERROR or not (report_dir / "results.json").is_file():
        sys.exit(exit_code(code, report_dir / "results.json"))
    run = load_run(str(report_dir))
    run.meta.setdefault("purpose", purpose)
    if baseline is DEFAULT_BASELINE:
        from farm.results.gate import figure_timings

        baseline = default_baseline(None, purpose, run.meta.get("bundle_name") or "", config_path,
                                    who="farm qualify", timings=figure_timings(run))
    try:
        written = write_outputs(run, baseline, report_dir, ("markdown", "html"), min_effect=effect,
                                inconclusive_fails=inconclusive == "fail",
                                history=history_of(run, config_path=config_path), evidence_dir=report_dir)
    except OSError as e:  # the JUnit files and results.json are written; the pages could not be
        click.echo(f"farm qualify: cannot write report.html/report.md to {report_dir}: "
                   f"{e.strerror or e} (the run's JUnit files and results.json are there)", err=True)
        sys.exit(exit_code(code, report_dir / "results.json") or ExitCode.INFRA)
    click.echo(f"markdown: {written.paths['markdown']}")
    click.echo(str(written.paths["html"]))  # the last line: where the report is
    if report_dir != out and written.exit_code == ExitCode.OK:
        # Every test passed, but the report is not where it was asked for: infrastructure (3).
        sys.exit(ExitCode.INFRA)
    sys.exit(written.exit_code)


class _ReportWhere:
    """A pytest plugin of this command's run: where the ptefarm plugin's collector wrote the report
    (None: nowhere, or no collector)."""

    written: Path | None = None

    @pluggy.HookimplMarker("pytest")(wrapper=True)  # pytest.hookimpl, without importing pytest here
    def pytest_sessionfinish(self, session):
        result = yield  # after every other implementation: the collector's wrote the report
        collector = session.config.pluginmanager.get_plugin("ptefarm-results")
        self.written = getattr(collector, "written", None)
        return result


# pytest plugins that executorch's dependencies install and pytest loads into every process, which the
# farm's suites never use. Their imports (hypothesis's above all) cost each pytest process 3-4 s of a
# 4.5-6 s start-up on a loaded 2-core host, against 1.2-1.9 s without them, and every xdist worker
# pays it again: at 8 workers on 2 cores that start-up was most of a run's overhead. A user's own
# test that needs one passes it back after `--`: `farm qualify -- -p anyio`.
# ``baseline`` not named: the default one, chosen once the run's figures say their timing.
DEFAULT_BASELINE = object()
UNRELATED_PLUGINS = ("hypothesispytest", "hydra_pytest", "anyio", "kgb")


def unrelated_plugin_args() -> list[str]:
    """``-p no:NAME`` for each of UNRELATED_PLUGINS that is installed here (the others are left out:
    the command line stays what this environment needs)."""
    from importlib.metadata import entry_points

    installed = {ep.name for ep in entry_points(group="pytest11")}
    return [arg for name in UNRELATED_PLUGINS if name in installed for arg in ("-p", f"no:{name}")]


def exit_code(pytest_code: int, results: Path) -> int:
    """The farm's exit code (farm.exitcodes) from the written report; from pytest's own where no report
    was written."""
    import pytest

    from farm.exitcodes import ExitCode, for_verdict

    if pytest_code == pytest.ExitCode.USAGE_ERROR:
        return ExitCode.BAD_INPUT
    try:
        meta = json.loads(results.read_text())["meta"]
    except (OSError, ValueError, KeyError):
        if pytest_code == ExitCode.INFRA:  # the plugin's pytest.exit before any test
            return ExitCode.INFRA
        if pytest_code == pytest.ExitCode.TESTS_FAILED:
            # Tests ran, but no report could be written (the plugin named why on stderr): what the
            # verdict was cannot be read here, and a write error is never a test failure.
            return ExitCode.INFRA
        return ExitCode.INTERRUPTED if pytest_code == pytest.ExitCode.INTERRUPTED else ExitCode.BAD_INPUT
    if meta.get("interrupted"):
        return ExitCode.INTERRUPTED
    return for_verdict(meta["verdict"])
