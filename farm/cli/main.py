"""Entry point of the ``farm`` command: one click group, one module per sub-command family."""

from __future__ import annotations

import sys

import click

from farm.errors import FarmError
from farm.exitcodes import ExitCode, for_error


class FarmGroup(click.Group):
    """Turns FarmError into a one-line message and the exit code of farm.exitcodes (3 infrastructure,
    2 bad input, 1 a failure of the code under test), and Ctrl-C into 130; never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except FarmError as e:
            kind = type(e).__name__
            click.echo(f"farm: error: {e} [{kind}]", err=True)
            sys.exit(for_error(e))
        except KeyboardInterrupt:
            click.echo("farm: interrupted", err=True)
            sys.exit(ExitCode.INTERRUPTED)


@click.group(cls=FarmGroup)
@click.version_option(package_name="ptefarm")
def main() -> None:
    """ptefarm: lease Snapdragon devices, deploy ExecuTorch .pte bundles, run and report."""


def _register() -> None:
    # Each sub-command family lives in its own module; imports stay inside the commands that need
    # torch or adb, so that `farm --help` is instant.
    from farm.cli import ab as ab_cli
    from farm.cli import adb as adb_cli
    from farm.cli import bundle as bundle_cli
    from farm.cli import chaos as chaos_cli
    from farm.cli import devices as devices_cli
    from farm.cli import export as export_cli
    from farm.cli import history as history_cli
    from farm.cli import pool as pool_cli
    from farm.cli import pool_admin  # noqa: F401  (adds tag, prune, watch to `farm pool`)
    from farm.cli import qualify as qualify_cli
    from farm.cli import report as report_cli
    from farm.cli import virtual as virtual_cli

    main.add_command(export_cli.export)
    main.add_command(bundle_cli.bundle)
    main.add_command(virtual_cli.virtual)
    for command in devices_cli.COMMANDS:  # devices, deploy, run
        main.add_command(command)
    main.add_command(pool_cli.pool)
    main.add_command(qualify_cli.qualify)
    main.add_command(chaos_cli.chaos)
    main.add_command(report_cli.report)
    main.add_command(history_cli.history)
    main.add_command(history_cli.baseline)
    main.add_command(ab_cli.ab)
    main.add_command(history_cli.results)
    main.add_command(adb_cli.adb)


_register()

if __name__ == "__main__":
    main()
