"""Options shared by the ``farm`` commands, declared once.

``--config`` (and ``--url`` for the pool) may be given on a command group and on its sub-commands:
``farm pool --config X status`` and ``farm pool status --config X`` mean the same; when both are given
the sub-command's wins. The values go into ``click.Context.meta``, which every nested context shares,
and commands read them with :func:`farm_config`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click

from farm.config import FarmConfig, load_config

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


def config_path() -> str | None:
    """The ``--config`` given anywhere on the command line, None for the default lookup."""
    return click.get_current_context().meta.get(CONFIG_KEY)


def farm_config() -> FarmConfig:
    """The farm config named by ``--config`` (validated), with ``--url`` applied."""
    meta = click.get_current_context().meta
    config = load_config(meta.get(CONFIG_KEY))
    url = meta.get(POOL_URL_KEY)
    return replace(config, pool=replace(config.pool, url=url)) if url else config
