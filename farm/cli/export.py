"""`farm export`: write the reference bundle (or find it in the cache) and print its manifest path."""

from __future__ import annotations

import click

from farm.model.config import CONFIGS


@click.command()
@click.option("--config", "config_name", default="tiny", show_default=True,
              help=f"reference model config: {', '.join(CONFIGS)}")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="bundle cache directory [default: $PTEFARM_HOME/exports]")
def export(config_name: str, out_dir: str | None) -> None:
    """Export the reference llama bundle: kv and hybrid .pte (XNNPACK), tokenizer, manifest.

    Cached by content: exporting the same config again is instant. The last line printed is the
    manifest's path, for scripts: MANIFEST=$(farm export | tail -n1).
    """
    from farm.export import MANIFEST, bundle_dir, export_bundle

    if not (bundle_dir(config_name, out_dir) / MANIFEST).is_file():
        click.echo(f"exporting the {config_name} reference bundle (cached afterwards) ...", err=True)
    manifest = export_bundle(config_name, out_dir)
    click.echo(str(manifest))
