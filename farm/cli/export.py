"""`farm export`: write the reference bundle (or find it in the cache) and print its manifest path."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import click

from farm.cli.progress import console as cli_console
from farm.errors import UsageError
from farm.model.config import CONFIGS

DEFAULT_MODEL = "tiny"


@click.command()
@click.option("--model", "model_name", default=None,
              help=f"reference model config: {', '.join(CONFIGS)} [default: {DEFAULT_MODEL}]")
@click.option("--config", "deprecated_config", default=None, hidden=True,
              help="deprecated alias of --model (everywhere else --config is the farm config)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="bundle cache directory [default: $PTEFARM_HOME/exports]")
def export(model_name: str | None, deprecated_config: str | None, out_dir: str | None) -> None:
    """Export a reference llama bundle: kv and hybrid .pte (XNNPACK), tokenizer, manifest. tiny is
    llama3 with a tiktoken tokenizer.model; tiny-qwen2_5 is qwen2_5 with an HF tokenizer.json.

    Cached by content: exporting the same model again is instant. The last line printed is the
    manifest's path, for scripts: MANIFEST=$(farm export --model tiny | tail -n1).
    """
    from farm.bundle.export import MANIFEST, bundle_dir, export_bundle

    if deprecated_config is not None:
        click.echo(f"farm export: warning: --config {deprecated_config} is deprecated, use --model "
                   f"{deprecated_config}", err=True)
        if model_name is not None and model_name != deprecated_config:
            raise UsageError(f"--model {model_name} and --config {deprecated_config} disagree: "
                             f"give --model only")
    name = model_name or deprecated_config or DEFAULT_MODEL
    if name not in CONFIGS:
        flag = "--model" if model_name or not deprecated_config else "--config"
        raise UsageError(f"{flag}: unknown reference model {name!r} (known: {', '.join(CONFIGS)})")
    if not (bundle_dir(name, out_dir) / MANIFEST).is_file():
        click.echo(f"exporting the {name} reference bundle (cached afterwards) ...", err=True)
    with export_progress() as on_step:
        manifest = export_bundle(name, out_dir, on_step=on_step)
    click.echo(str(manifest))


@contextlib.contextmanager
def export_progress() -> Iterator[Callable[[str, int, int], None]]:
    """The export's steps on stderr: a spinner line at a terminal, one plain line each elsewhere."""
    err = cli_console(stderr=True)
    if not err.is_terminal:
        yield lambda what, step, steps: click.echo(f"farm export: [{step}/{steps}] {what}", err=True)
        return
    with err.status("exporting ...") as status:
        yield lambda what, step, steps: status.update(f"[{step}/{steps}] {what} ...")
