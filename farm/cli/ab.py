"""``farm ab A [B]``: A/B on the same devices, with a confidence interval (farm/ab.py)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import click

from farm.cli.options import config_option, farm_config, json_option
from farm.exitcodes import ExitCode
from farm.vocab import Timing, Updater

UPDATER_NAMES = [u.value for u in Updater]
# The design's defaults are farm.results.ab.ABConfig's (tests/cli/test_ab.py holds them equal), written
# out here: importing the statistics (numpy, scipy) would slow every farm command's start.


@click.command("ab")
@click.argument("manifest_a", type=click.Path(dir_okay=False))
@click.argument("manifest_b", type=click.Path(dir_okay=False), required=False)
@click.option("--soc", required=True, help="the SoC whose devices run both variants, e.g. SM8650")
@click.option("--devices", "n_devices", type=int, default=1, show_default=True,
              help="devices of the SoC to lease, each running every block")
@click.option("--virtual", "virtual_socs", multiple=True, metavar="SOC[:N]",
              help="on fresh virtual devices of a private farm (their timing: the config's "
                   "virtual.timing); e.g. --virtual SM8650:2")
@click.option("--mode", default="hybrid", show_default=True)
@click.option("--seq-len", type=int, default=128, show_default=True)
@click.option("--prompt", default="Once upon a time", show_default=True)
@click.option("--updater", type=click.Choice(UPDATER_NAMES), default=Updater.SMART_MASK.value,
              show_default=True, help="both variants' updater (unless --a-updater/--b-updater)")
@click.option("--a-updater", type=click.Choice(UPDATER_NAMES), default=None)
@click.option("--b-updater", type=click.Choice(UPDATER_NAMES), default=None)
@click.option("--a-arg", "a_args", multiple=True, metavar="ARG",
              help="an extra runner argument for A only (repeatable), e.g. --a-arg=--seed=7")
@click.option("--b-arg", "b_args", multiple=True, metavar="ARG", help="the same for B")
@click.option("--min-effect", type=float, default=2.0, show_default=True,
              help="%: a smaller difference is 'same'")
@click.option("--alpha", type=float, default=0.05, show_default=True,
              help="the whole comparison's chance of calling identical variants different")
@click.option("--min-blocks", type=int, default=4, show_default=True,
              help="blocks per device before the first look")
@click.option("--max-blocks", type=int, default=16, show_default=True,
              help="blocks per device at most")
@click.option("--look-every", type=int, default=4, show_default=True,
              help="blocks per device between looks")
@click.option("--fixed", is_flag=True, help="one look after --max-blocks (fixed N), not sequential")
@click.option("--budget-s", type=float, default=None, help="stop after this many device-seconds of runs")
@click.option("--seed", type=int, default=None, help="the block order's seed (default: random)")
@click.option("--fail-if-slower", is_flag=True, help="exit 4 when B is slower (a gate)")
@config_option
@json_option
def ab(manifest_a, manifest_b, soc, n_devices, virtual_socs, mode, seq_len, prompt, updater, a_updater,
       b_updater, a_args, b_args, min_effect, alpha, min_blocks, max_blocks, look_every, fixed, budget_s, seed,
       fail_if_slower, as_json) -> None:
    """Compare variant B with A on the same devices: two bundles, or one bundle with two updaters.

    Runs alternate in blocks of one run of each, in a random order, on every device; the verdict is the
    ratio B / A of tokens/second with its interval: faster, slower, same (within --min-effect) or
    undecided. Sequential by default: it stops as soon as the interval decides.

    \b
    Examples:
      farm ab bundle/manifest.json --soc SM8650 --a-updater ShiftPointer --b-updater SmartMask --seq-len 4096
      farm ab main/manifest.json pr/manifest.json --soc SM8650 --devices 2 --fail-if-slower
    """
    from farm.ab import Variant, run_ab
    from farm.bundle import manifest as bundle_mod
    from farm.execute.chunking import ChunkPolicy
    from farm.execute.runprofile import RunRequest
    from farm.results.ab import ABConfig
    from farm.session import open_farm, parse_soc_counts

    config = farm_config()
    bundle_a = bundle_mod.load(manifest_a, verify=True)
    bundle_b = bundle_mod.load(manifest_b, verify=True) if manifest_b else bundle_a
    base = RunRequest(prompts=[prompt], mode=mode, updater=updater, seq_len=seq_len)
    a = Variant("A", bundle_a, replace(base, updater=a_updater or updater, extra_args=list(a_args)))
    b = Variant("B", bundle_b, replace(base, updater=b_updater or updater, extra_args=list(b_args)))
    if manifest_b is None and a.request == b.request:
        raise click.UsageError("A and B are the same: give a second bundle, --a-updater/--b-updater "
                               "or --a-arg/--b-arg")
    design = ABConfig(alpha=alpha, min_effect=min_effect / 100, min_blocks=min(min_blocks, max_blocks),
                      max_blocks=max_blocks, look_every=look_every, sequential=not fixed)

    def on_look(result, blocks: int) -> None:
        if not as_json:
            interval = "" if result.ratio is None else \
                f" ratio {result.ratio:.4f} [{result.low:.4f}, {result.high:.4f}]"
            click.echo(f"after {blocks} block(s)/device:{interval} -> {result.verdict}", err=True)

    virtual = parse_soc_counts(virtual_socs) if virtual_socs else []
    with open_farm(config, virtual=virtual) as farm:
        outcome = run_ab(farm, a, b, soc=soc.upper(), devices=n_devices, config=design, budget_s=budget_s,
                         seed=seed, run_timeout_s=config.run.command_timeout_s,
                         acquire_timeout_s=config.pool.acquire_timeout_s, on_look=on_look,
                         chunking=ChunkPolicy.configured(config.deploy))
    r = outcome.result
    if as_json:
        click.echo(json.dumps(outcome.to_json(), indent=1))
    else:
        click.echo(f"{a.describe()}\n{b.describe()}\n{soc} x{len(outcome.serials)} "
                   f"({', '.join(outcome.serials)}), figures: {Timing(outcome.timing).figures}")
        if r.ratio is not None:
            click.echo(f"B / A = {r.ratio:.4f}, {1 - r.level:.2%} interval [{r.low:.4f}, {r.high:.4f}]"
                       f" over {r.blocks} block(s); per device: "
                       + ", ".join(f"{s} {v:.4f}" for s, v in r.per_device.items()))
        throttled = sum(s.throttled for s in outcome.samples)
        click.echo(f"verdict: {r.verdict} ({r.reason}); {outcome.stopped}; "
                   f"{outcome.device_s:.0f} device-seconds; {throttled} throttled run(s)")
    if fail_if_slower and r.verdict == "slower":
        sys.exit(ExitCode.REGRESSION)
