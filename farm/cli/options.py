"""Options shared by the ``farm`` commands, declared once.

``--config`` (and ``--url`` for the pool) may be given on a command group and on its sub-commands:
``farm pool --config X status`` and ``farm pool status --config X`` mean the same; when both are given
the sub-command's wins. The values go into ``click.Context.meta``, which every nested context shares,
and commands read them with :func:`farm_config`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import click

from farm.config import FarmConfig, load_config
from farm.errors import UsageError

CONFIG_KEY = "ptefarm.config_path"
POOL_URL_KEY = "ptefarm.pool_url"


def _remember(key: str):
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            ctx.meta[key] = value
        return value
    return callback


config_option = click.option(
    "--config", type=click.Path(dir_okay=False), default=None, expose_value=False,
    callback=_remember(CONFIG_KEY),
    help="Farm config (TOML) [default: $PTEFARM_CONFIG, ./farm.toml, else built-in defaults].")

pool_url_option = click.option(
    "--url", default=None, expose_value=False, callback=_remember(POOL_URL_KEY),
    help="Pool URL, overriding the config's pool.url.")

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def older_than_option(help: str):
    """``--older-than DAYS`` of a ``prune`` command; not given (None), the config's retention applies
    (``older_than_days``), so ``help`` names its setting."""
    return click.option("--older-than", "days", type=float, default=None, metavar="DAYS", help=help)


def older_than_days(days: float | None, retention_days: float, *, allow_zero: bool = False) -> float:
    """The days a ``prune`` keeps: ``--older-than``'s, checked (UsageError naming the flag), else the
    config's ``retention_days``."""
    if days is None:
        return retention_days
    if not (math.isfinite(days) and (days >= 0 if allow_zero else days > 0)):
        raise UsageError(f"--older-than: must be a finite number of days {'>=' if allow_zero else '>'} 0, "
                         f"got {days!r}")
    return days


def config_path() -> str | None:
    """The ``--config`` given anywhere on the command line, None for the default lookup."""
    return click.get_current_context().meta.get(CONFIG_KEY)


def farm_config() -> FarmConfig:
    """The farm config named by ``--config`` (validated), with ``--url`` applied."""
    meta = click.get_current_context().meta
    config = load_config(meta.get(CONFIG_KEY))
    url = meta.get(POOL_URL_KEY)
    return replace(config, pool=replace(config.pool, url=url)) if url else config
