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
    inside its own directory): build outputs flat by name, the QNN libraries the manifest needs under
    ``qnn-sdk/`` as their folder holds them (SDK layout or flat). Missing inputs stay as given, for
    the error message."""
    from farm.bundle.qnn import QnnSdk

    try:
        sdk = QnnSdk.at(a.qnn_sdk)
        needed = [path for path, _ in sdk.needed(a.htp_archs)]
    except UsageError:
        needed = []  # make_manifest names the problem
    if (needed and all(p.is_file() for p in needed)
            and not a.qnn_sdk.resolve().is_relative_to(base.resolve())):
        staged = base / "qnn-sdk"
        for lib in needed:
            _place(lib, staged / lib.relative_to(a.qnn_sdk), base, created)
        a = replace(a, qnn_sdk=staged)
    return replace(a, ptes={m: _place(p, base / p.name, base, created) for m, p in a.ptes.items()},
                   tokenizer=_place(a.tokenizer, base / a.tokenizer.name, base, created),
                   runner=_place(a.runner, base / a.runner.name, base, created),
                   backend_lib=_place(a.backend_lib, base / a.backend_lib.name, base, created),
                   extra=[_place(p, base / p.name, base, created) for p in a.extra],
                   attention_sink_rope=a.attention_sink_rope and _place(
                       a.attention_sink_rope, base / a.attention_sink_rope.name, base, created))


def _found(artifact: str | None, build_folder: str | None, ptes: tuple[str, ...],
           tokenizer: str | None, runner: str | None, backend_lib: str | None):
    """The programs, tokenizer, runner and backend library: each as its flag names it, else found
    by upstream's name in the artifact or build folder."""
    from farm.bundle import qnn

    chosen = _mode_pte(ptes)
    if not chosen and artifact is not None:
        chosen = qnn.find_ptes(Path(artifact))
    if not chosen:
        raise UsageError("--pte: name the programs (MODE=FILE) or the folder llama.py wrote them to "
                         "(--artifact)")
    if tokenizer is None:
        if artifact is None:
            raise UsageError("--tokenizer: name the runtime tokenizer, or --artifact where llama.py "
                             "saved it")
        tokenizer = str(qnn.find_tokenizer(Path(artifact)))
    if runner is None or backend_lib is None:
        if build_folder is None:
            raise UsageError("--build-folder: name the Android build folder (or both --runner and "
                             "--backend-lib)")
        build = Path(build_folder)
        if runner is None:
            runner = str(qnn.find_in_build(build, qnn.RUNNER_IN_BUILD, "--runner"))
        if backend_lib is None:
            backend_lib = str(qnn.find_in_build(build, qnn.BACKEND_IN_BUILD, "--backend-lib"))
    return chosen, Path(tokenizer), Path(runner), Path(backend_lib)


def _evictor(flag: str | None, artifact: str | None) -> Path | None:
    from farm.bundle import qnn

    if flag is not None:
        return Path(flag)
    return qnn.find_evictor(Path(artifact)) if artifact is not None else None


def _warn_unloadable(written) -> None:
    """A runner, backend or aarch64 QNN library that no phone can load (an LFS pointer, an x86 build)
    is written down as given (virtual devices run stand-ins), with a warning naming it."""
    from farm.bundle.qnn import not_an_android_binary

    for f in written.files:
        if f.role in ("runner", "backend_lib") or (f.role == "qnn_lib" and "Skel" not in f.name):
            problem = not_an_android_binary(f.path)
            if problem:
                click.echo(f"farm: warning: {f.name} ({f.path}) {problem}: a phone cannot load it",
                           err=True)


@click.group("bundle")
def bundle() -> None:
    """Bundle manifests: the files a model needs on a device, with sizes and digests."""


@bundle.command("create")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--name", required=True, help="bundle name (also the workspace directory on devices)")
@click.option("--dialect", default="auto", show_default=True,
              help="auto (read from the runner's --help on the device, at its first run), qnn-v1.0 "
                   "(--kv_updater, v0.6-v1.0.x) or qnn-v1.4 (SmartMask only, v1.1+)")
@click.option("--artifact", type=click.Path(file_okay=False),
              help="llama.py's --artifact folder: kv_llama_qnn.pte, hybrid_llama_qnn.pte, "
                   "lookahead_llama_qnn.pte and the tokenizer (tokenizer.json, .model or .bin)")
@click.option("--build-folder", type=click.Path(file_okay=False),
              help="the Android build folder (llama.py's --build_folder): "
                   "examples/qualcomm/oss_scripts/llama/qnn_llama_runner and "
                   "backends/qualcomm/libqnn_executorch_backend.so, or both at its top")
@click.option("--qnn-sdk", envvar="QNN_SDK_ROOT", type=click.Path(file_okay=False),
              help="QNN SDK root (default: $QNN_SDK_ROOT), or a flat folder of its libraries")
@click.option("--htp-arch", "htp_archs", multiple=True, required=True,
              help="HTP arch to include Stub/Skel for (repeatable): v73, v75, v79 ...")
@click.option("--pte", "ptes", multiple=True, metavar="MODE=FILE",
              help="a program per mode, instead of those found in --artifact: kv=kv_llama_qnn.pte")
@click.option("--hybrid-ar-len", type=int, default=32, show_default=True,
              help="ar_len of the hybrid mode's prefill method")
@click.option("--tokenizer", type=click.Path(dir_okay=False),
              help="the runtime tokenizer, instead of the one found in --artifact")
@click.option("--runner", type=click.Path(dir_okay=False),
              help="qnn_llama_runner, instead of the one in --build-folder")
@click.option("--backend-lib", type=click.Path(dir_okay=False),
              help="libqnn_executorch_backend.so, instead of the one in --build-folder")
@click.option("--decoder-model-version", default="llama3", show_default=True)
@click.option("--extra", multiple=True, type=click.Path(dir_okay=False),
              help="any other file the runner needs in its workspace")
@click.option("--attention-sink-rope", type=click.Path(dir_okay=False),
              help="the attention-sink evictor (llama.py 1.4.1 --use_attention_sink), instead of the "
                   "attention_sink_evictor.pte found in --artifact; given to runs past --context-len")
@click.option("--context-len", type=int,
              help="the model's context (llama.py --max_context_len): the suites' 'context' seq_lens, "
                   "and runs past it get the attention-sink evictor")
def create(manifest, name, dialect, artifact, build_folder, qnn_sdk, htp_archs, ptes, hybrid_ar_len,
           tokenizer, runner, backend_lib, decoder_model_version, extra, attention_sink_rope,
           context_len) -> None:
    """Describe real QNN artifacts in MANIFEST (sizes and sha256 of every file).

    \b
        farm bundle create bundles/llama3_2-1b/manifest.json --name llama3_2-1b \\
          --artifact llama_qnn --build-folder build-android --htp-arch v75 \\
          --tokenizer tokenizer.model          # QNN libraries from $QNN_SDK_ROOT

    Files are found by the names upstream's llama.py and SimpleADB give them; a flag naming a file
    wins. A manifest names only files inside its own directory: artifacts from elsewhere are
    hard-linked (or copied, across file systems) next to it, the QNN libraries under qnn-sdk/.
    """
    from farm.bundle.qnn import QnnArtifacts, make_manifest

    if not qnn_sdk:
        raise UsageError("--qnn-sdk: name the QNN SDK root or a folder of its libraries "
                         "($QNN_SDK_ROOT is not set)")
    found_ptes, found_tok, found_runner, found_backend = _found(
        artifact, build_folder, ptes, tokenizer, runner, backend_lib)
    artifacts = QnnArtifacts(name=name, dialect=dialect, ptes=found_ptes, tokenizer=found_tok,
                             runner=found_runner, backend_lib=found_backend, qnn_sdk=Path(qnn_sdk),
                             htp_archs=list(htp_archs), hybrid_ar_len=hybrid_ar_len,
                             decoder_model_version=decoder_model_version,
                             extra=[Path(p) for p in extra],
                             attention_sink_rope=_evictor(attention_sink_rope, artifact),
                             context_len=context_len)
    created: list[Path] = []
    base = Path(manifest).parent
    try:
        base.mkdir(parents=True, exist_ok=True)
        written = make_manifest(_stage(artifacts, base, created), Path(manifest))
    except BaseException:
        for path in created:  # a refused create leaves nothing behind
            path.unlink(missing_ok=True)
        raise
    _warn_unloadable(written)
    total = sum(f.size for f in written.files)
    click.echo(f"{manifest}: {len(written.files)} files, {total / 1e6:.1f} MB, HTP "
               f"{', '.join(sorted(written.htp_archs()))}, modes {', '.join(sorted(written.modes))}, "
               f"runner dialect {written.runner_dialect}")


@bundle.command("verify")
@click.argument("manifest", type=click.Path(dir_okay=False))
def verify(manifest) -> None:
    """Check every file of MANIFEST: inside its directory, with the recorded size and sha256."""
    from farm.bundle import manifest as bundle_mod

    b = bundle_mod.load(manifest, verify=True)
    click.echo(f"{manifest}: {len(b.files)} files match")
