"""Manifests for real QNN artifacts: the file set upstream's SimpleADB pushes, described once.

Upstream pushes, flat into the workspace: the .pte files; from the QNN SDK
`lib/aarch64-android/libQnnHtp.so`, `libQnnHtpV{arch}Stub.so`, `libQnnHtpPrepare.so`, `libQnnSystem.so`
(and `libQnnModelDlc.so` in newer SDKs) and `lib/hexagon-v{arch}/unsigned/libQnnHtpV{arch}Skel.so`; the
runner and `libqnn_executorch_backend.so` from the Android build; the tokenizer. Here the Stub and Skel
are marked with their HTP arch, so one manifest serves a farm of mixed SoCs and each device receives
only its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from farm.bundle.manifest import MANIFEST_DIALECTS, Bundle, BundleFile, Mode, describe_file
from farm.errors import UsageError
from farm.vocab import Dialect, EvalMode

COMMON_SDK_LIBS = ("libQnnHtp.so", "libQnnHtpPrepare.so", "libQnnSystem.so")
OPTIONAL_SDK_LIBS = ("libQnnModelDlc.so",)
EVAL_MODES: dict[str, int] = {m.value: m.number for m in EvalMode}


@dataclass
class QnnArtifacts:
    name: str
    dialect: str
    ptes: dict[str, Path]  # mode (kv, hybrid) -> .pte
    tokenizer: Path
    runner: Path
    backend_lib: Path
    qnn_sdk: Path
    htp_archs: list[str]
    hybrid_ar_len: int = 32
    decoder_model_version: str = "llama3"
    extra: list[Path] = field(default_factory=list)


def _existing(path: Path, what: str) -> Path:
    if not path.is_file():
        raise UsageError(f"{what}: {path} does not exist")
    return path


def sdk_libs(sdk: Path, arch: str) -> list[tuple[Path, str | None]]:
    """(path, htp_arch) of the QNN SDK libraries specific to one HTP arch: its Stub and Skel."""
    n = arch.removeprefix("v")
    if not n.isdigit():
        raise UsageError(f"--htp-arch: {arch!r} is not an HTP arch such as v75")
    android = sdk / "lib" / "aarch64-android"
    if not android.is_dir():
        raise UsageError(f"--qnn-sdk: {sdk} has no lib/aarch64-android (is it a QNN SDK root?)")
    return [
        (_existing(android / f"libQnnHtpV{n}Stub.so", "--qnn-sdk"), f"v{n}"),
        (_existing(sdk / "lib" / f"hexagon-v{n}" / "unsigned" / f"libQnnHtpV{n}Skel.so", "--qnn-sdk"),
         f"v{n}"),
    ]


def make_manifest(a: QnnArtifacts, manifest_path: Path) -> Bundle:
    """Describe the artifacts (sizes, sha256) and write the manifest atomically."""
    qnn_dialects = [d for d in MANIFEST_DIALECTS if d != Dialect.HOST]  # "auto": the runner tells
    if a.dialect not in qnn_dialects:
        raise UsageError(f"--dialect: {a.dialect!r} is not a QNN runner dialect "
                         f"({', '.join(qnn_dialects)})")
    if not a.ptes:
        raise UsageError("--pte: at least one MODE=FILE is needed (kv=..., hybrid=...)")
    if not a.htp_archs:
        raise UsageError("--htp-arch: name at least one HTP arch (e.g. v75 for SM8650)")
    base = manifest_path.parent
    files: list[BundleFile] = []
    modes: dict[str, Mode] = {}
    for mode, pte in a.ptes.items():
        if mode not in EVAL_MODES:
            raise UsageError(f"--pte {mode}=...: unknown mode (known: {', '.join(EVAL_MODES)})")
        files.append(describe_file(base, _existing(pte, f"--pte {mode}"), role="pte"))
        modes[mode] = Mode(pte=pte.name, eval_mode=EVAL_MODES[mode],
                           ar_len=a.hybrid_ar_len if mode == EvalMode.HYBRID else 1)
    files.append(describe_file(base, _existing(a.tokenizer, "--tokenizer"), role="tokenizer"))
    files.append(describe_file(base, _existing(a.runner, "--runner"), role="runner"))
    files.append(describe_file(base, _existing(a.backend_lib, "--backend-lib"), role="backend_lib"))
    android = a.qnn_sdk / "lib" / "aarch64-android"
    for arch in a.htp_archs:
        for path, htp in sdk_libs(a.qnn_sdk, arch):
            files.append(describe_file(base, path, role="qnn_lib", htp_arch=htp))
    for lib in COMMON_SDK_LIBS:
        files.append(describe_file(base, _existing(android / lib, "--qnn-sdk"), role="qnn_lib"))
    for lib in OPTIONAL_SDK_LIBS:
        if (android / lib).is_file():
            files.append(describe_file(base, android / lib, role="qnn_lib"))
    for path in a.extra:
        files.append(describe_file(base, _existing(path, "--extra"), role="other"))
    seen: dict[tuple[str, str | None], Path] = {}
    for f in files:
        key = (f.name, f.htp_arch)
        if key in seen:
            raise UsageError(f"two files would land as {f.name!r} in the workspace: {seen[key]} and "
                             f"{f.path}")
        seen[key] = f.path
    bundle = Bundle(name=a.name, runner_dialect=a.dialect, tokenizer=a.tokenizer.name, files=files,
                    modes=modes, decoder_model_version=a.decoder_model_version, runner=a.runner.name)
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    bundle.write(manifest_path)
    return bundle
