"""`farm bundle`: write a manifest for real QNN artifacts; verify a manifest against its files."""

from __future__ import annotations

from pathlib import Path

import click

from farm.errors import UsageError


def _mode_pte(values: tuple[str, ...]) -> dict[str, Path]:
    ptes: dict[str, Path] = {}
    for value in values:
        mode, sep, path = value.partition("=")
        if not sep or not mode or not path:
            raise UsageError(f"--pte {value}: expected MODE=FILE, e.g. hybrid=hybrid_llama_qnn.pte")
        ptes[mode] = Path(path)
    return ptes


@click.group("bundle")
def bundle() -> None:
    """Bundle manifests: the files a model needs on a device, with sizes and digests."""


@bundle.command("create")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--name", required=True, help="bundle name (also the workspace directory on devices)")
@click.option("--dialect", default="qnn-v1.0", show_default=True,
              help="qnn-v1.0 (--kv_updater) or qnn-shared-buffer (SmartMask only, v1.1+)")
@click.option("--pte", "ptes", multiple=True, required=True, metavar="MODE=FILE",
              help="a program per mode: kv=kv_llama_qnn.pte, hybrid=hybrid_llama_qnn.pte")
@click.option("--hybrid-ar-len", type=int, default=32, show_default=True,
              help="ar_len of the hybrid mode's prefill method")
@click.option("--tokenizer", required=True, type=click.Path(dir_okay=False))
@click.option("--runner", required=True, type=click.Path(dir_okay=False),
              help="qnn_llama_runner from the Android build")
@click.option("--backend-lib", required=True, type=click.Path(dir_okay=False),
              help="libqnn_executorch_backend.so from the Android build")
@click.option("--qnn-sdk", required=True, type=click.Path(file_okay=False),
              help="QNN SDK root ($QNN_SDK_ROOT)")
@click.option("--htp-arch", "htp_archs", multiple=True, required=True,
              help="HTP arch to include Stub/Skel for (repeatable): v73, v75, v79 ...")
@click.option("--decoder-model-version", default="llama3", show_default=True)
@click.option("--extra", multiple=True, type=click.Path(dir_okay=False),
              help="any other file the runner needs in its workspace")
def create(manifest, name, dialect, ptes, hybrid_ar_len, tokenizer, runner, backend_lib, qnn_sdk,
           htp_archs, decoder_model_version, extra) -> None:
    """Describe real QNN artifacts in MANIFEST (sizes and sha256 of every file)."""
    from farm.qnn_bundle import QnnArtifacts, make_manifest

    artifacts = QnnArtifacts(name=name, dialect=dialect, ptes=_mode_pte(ptes),
                             tokenizer=Path(tokenizer), runner=Path(runner),
                             backend_lib=Path(backend_lib), qnn_sdk=Path(qnn_sdk),
                             htp_archs=list(htp_archs), hybrid_ar_len=hybrid_ar_len,
                             decoder_model_version=decoder_model_version,
                             extra=[Path(p) for p in extra])
    written = make_manifest(artifacts, Path(manifest))
    total = sum(f.size for f in written.files)
    click.echo(f"{manifest}: {len(written.files)} files, {total / 1e6:.1f} MB, HTP "
               f"{', '.join(sorted(written.htp_archs()))}")


@bundle.command("verify")
@click.argument("manifest", type=click.Path(dir_okay=False))
def verify(manifest) -> None:
    """Check every file of MANIFEST exists with the recorded size and sha256."""
    from farm import bundle as bundle_mod

    b = bundle_mod.load(manifest, verify=True)
    click.echo(f"{manifest}: {len(b.files)} files match")
