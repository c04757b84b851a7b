"""`farm bundle`: write a manifest for real QNN artifacts; verify a manifest against its files."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
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


def _place(src: Path, dest: Path, base: Path, created: list[Path]) -> Path:
    """``src`` as a file inside the bundle directory ``base``: itself when it already is inside, else a
    hard link (free on one file system) or a copy at ``dest``. A missing ``src`` is returned as is,
    so that the manifest writer names it with its flag."""
    if not src.is_file() or src.resolve().is_relative_to(base.resolve()):
        return src
    if dest in created:
        raise UsageError(f"two files would land as {dest.name!r} in {base}: {src} and another")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.staging-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src.resolve(), tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dest)
    created.append(dest)
    return dest


def _stage(a, base: Path, created: list[Path]):
    """The artifacts placed inside the manifest's directory ``base`` (a manifest names only files
    inside its own directory): build outputs flat by name, the QNN SDK libraries the manifest needs
    under ``qnn-sdk/`` in the SDK's layout. Missing inputs stay as given, for the error message."""
    from farm.bundle.qnn import COMMON_SDK_LIBS, OPTIONAL_SDK_LIBS

    sdk_root = a.qnn_sdk
    android = sdk_root / "lib" / "aarch64-android"
    needed = [android / lib for lib in COMMON_SDK_LIBS]
    for arch in a.htp_archs:
        n = arch.removeprefix("v")
        needed += [android / f"libQnnHtpV{n}Stub.so",
                   sdk_root / "lib" / f"hexagon-v{n}" / "unsigned" / f"libQnnHtpV{n}Skel.so"]
    optional = [android / lib for lib in OPTIONAL_SDK_LIBS if (android / lib).is_file()]
    if (all(p.is_file() for p in needed) and a.htp_archs
            and not sdk_root.resolve().is_relative_to(base.resolve())):
        staged = base / "qnn-sdk"
        for lib in needed + optional:
            _place(lib, staged / lib.relative_to(sdk_root), base, created)
        a = replace(a, qnn_sdk=staged)
    return replace(a, ptes={m: _place(p, base / p.name, base, created) for m, p in a.ptes.items()},
                   tokenizer=_place(a.tokenizer, base / a.tokenizer.name, base, created),
                   runner=_place(a.runner, base / a.runner.name, base, created),
                   backend_lib=_place(a.backend_lib, base / a.backend_lib.name, base, created),
                   extra=[_place(p, base / p.name, base, created) for p in a.extra])


@click.group("bundle")
def bundle() -> None:
    """Bundle manifests: the files a model needs on a device, with sizes and digests."""


@bundle.command("create")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--name", required=True, help="bundle name (also the workspace directory on devices)")
@click.option("--dialect", default="qnn-v1.0", show_default=True,
              help="qnn-v1.0 (--kv_updater, v0.6-v1.0.x), qnn-shared-buffer (SmartMask only, "
                   "v1.1+) or auto (read from the runner's --help on the device, at its first run)")
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
    """Describe real QNN artifacts in MANIFEST (sizes and sha256 of every file).

    A manifest names only files inside its own directory: artifacts from elsewhere are hard-linked
    (or copied, across file systems) next to it, the QNN SDK libraries under qnn-sdk/.
    """
    from farm.bundle.qnn import QnnArtifacts, make_manifest

    artifacts = QnnArtifacts(name=name, dialect=dialect, ptes=_mode_pte(ptes),
                             tokenizer=Path(tokenizer), runner=Path(runner),
                             backend_lib=Path(backend_lib), qnn_sdk=Path(qnn_sdk),
                             htp_archs=list(htp_archs), hybrid_ar_len=hybrid_ar_len,
                             decoder_model_version=decoder_model_version,
                             extra=[Path(p) for p in extra])
    created: list[Path] = []
    base = Path(manifest).parent
    try:
        base.mkdir(parents=True, exist_ok=True)
        written = make_manifest(_stage(artifacts, base, created), Path(manifest))
    except BaseException:
        for path in created:  # a refused create leaves nothing behind
            path.unlink(missing_ok=True)
        raise
    total = sum(f.size for f in written.files)
    click.echo(f"{manifest}: {len(written.files)} files, {total / 1e6:.1f} MB, HTP "
               f"{', '.join(sorted(written.htp_archs()))}")


@bundle.command("verify")
@click.argument("manifest", type=click.Path(dir_okay=False))
def verify(manifest) -> None:
    """Check every file of MANIFEST: inside its directory, with the recorded size and sha256."""
    from farm.bundle import manifest as bundle_mod

    b = bundle_mod.load(manifest, verify=True)
    click.echo(f"{manifest}: {len(b.files)} files match")
