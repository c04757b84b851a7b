"""`farm export`: write the reference bundle (or find it in the cache) and print its manifest path."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import click

from farm.cli.progress import console as cli_console
from farm.errors import UsageError
from farm.model.config import CONFIGS, VLM_CONFIGS

DEFAULT_MODEL = "tiny"
LAYOUTS = ("v1.0", "v1.4")  # farm/bundle/export.py, farm/bundle/export_v14.py


@click.command()
@click.option("--model", "model_names", multiple=True,
              help=f"reference model config: {', '.join([*CONFIGS, *VLM_CONFIGS])} [default: "
                   f"{DEFAULT_MODEL}]; repeated, each is exported in turn by this one process")
@click.option("--config", "deprecated_config", default=None, hidden=True,
              help="deprecated alias of --model (everywhere else --config is the farm config)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="bundle cache directory [default: $PTEFARM_HOME/exports]")
@click.option("--layout", type=click.Choice(LAYOUTS), default=LAYOUTS[0], show_default=True,
              help="the programs' I/O layout: v1.0 (qnn_llama_runner v1.0.1's: a cache per layer and "
                   "head, method forward) or v1.4 (ExecuTorch 1.4.1's static llama, exported with the "
                   "wheel's model code: a cache per layer, kv_forward/prefill_forward, *_llama_qnn.pte)")
def export(model_names: tuple[str, ...], deprecated_config: str | None, out_dir: str | None,
           layout: str) -> None:
    """Export a reference llama bundle: kv and hybrid .pte (XNNPACK), tokenizer, manifest. tiny is
    llama3 with a tiktoken tokenizer.model; tiny-qwen2_5 is qwen2_5 with an HF tokenizer.json.

    Cached by content: exporting the same model again is instant. The last line printed is the
    manifest's path, for scripts: MANIFEST=$(farm export --model tiny | tail -n1). With several
    --model, one manifest path per model, in their order: one process pays the imports of torch and
    ExecuTorch once for all of them (ci/qualify.sh exports every bundle of the main job so).
    """
    from farm.bundle import export as v10
    from farm.bundle import export_v14 as v14

    from farm.bundle import export_vlm

    if deprecated_config is not None:
        click.echo(f"farm export: warning: --config {deprecated_config} is deprecated, use --model "
                   f"{deprecated_config}", err=True)
        if model_names and model_names != (deprecated_config,):
            raise UsageError(f"--model {' '.join(model_names)} and --config {deprecated_config} "
                             f"disagree: give --model only")
    names = list(model_names) or [deprecated_config or DEFAULT_MODEL]
    known = [*CONFIGS, *VLM_CONFIGS]
    for name in names:  # every name checked before the first export: a typo costs no minutes
        if name not in known:
            flag = "--model" if model_names or not deprecated_config else "--config"
            raise UsageError(f"{flag}: unknown reference model {name!r} (known: {', '.join(known)})")
    by_layout = v14 if layout == "v1.4" else v10
    for name in names:
        exporter, its_layout = by_layout, layout
        if name in VLM_CONFIGS:  # 1.4.1's multimodal layout only (qnn_multimodal_runner came after v1.0.1)
            exporter, its_layout = export_vlm, "v1.4"
        if not (exporter.bundle_dir(name, out_dir) / v10.MANIFEST).is_file():
            click.echo(f"exporting the {name} reference bundle, {its_layout} layout (cached "
                       f"afterwards) ...", err=True)
        with export_progress() as on_step:
            manifest = exporter.export_bundle(name, out_dir, on_step=on_step)
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
