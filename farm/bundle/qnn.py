"""Manifests for real QNN artifacts: the file set upstream's SimpleADB pushes, found by upstream's names.

What ExecuTorch v1.0.1 leaves where (examples/qualcomm/oss_scripts/llama/llama.py and
examples/qualcomm/utils.py, SimpleADB.push):

- the artifact folder (llama.py ``--artifact``, default ``./llama_qnn``): ``kv_llama_qnn.pte``,
  ``hybrid_llama_qnn.pte`` or ``lookahead_llama_qnn.pte`` (``stories260k_`` in front for that model),
  and for the Hugging Face models the tokenizer ``save_pretrained`` wrote there, ``tokenizer.json``
  (llama3_2 and stories take theirs from ``--tokenizer_model`` / ``--tokenizer_bin``, elsewhere);
- the Android build folder (``--build_folder``, e.g. ``build-android``):
  ``examples/qualcomm/oss_scripts/llama/qnn_llama_runner`` and
  ``backends/qualcomm/libqnn_executorch_backend.so``;
- ``$QNN_SDK_ROOT``: ``lib/aarch64-android/libQnnHtp.so``, ``libQnnHtpV{arch}Stub.so``,
  ``libQnnHtpPrepare.so``, ``libQnnSystem.so`` (and ``libQnnModelDlc.so`` in newer SDKs) and
  ``lib/hexagon-v{arch}/unsigned/libQnnHtpV{arch}Skel.so``.

SimpleADB pushes all of them flat into the workspace, so each folder may also be flat: the build's two
files, or the SDK's libraries, side by side under their own names (a folder copied off a device, or one
a build script filled). Here the Stub and Skel are marked with their HTP arch, so one manifest serves a
farm of mixed SoCs and each device receives only its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from farm.bundle.manifest import MANIFEST_DIALECTS, Bundle, BundleFile, Mode, describe_file
from farm.errors import UsageError
from farm.vocab import Dialect, EvalMode

COMMON_SDK_LIBS = ("libQnnHtp.so", "libQnnHtpPrepare.so", "libQnnSystem.so")
OPTIONAL_SDK_LIBS = ("libQnnModelDlc.so",)
EVAL_MODES: dict[str, int] = {m.value: m.number for m in EvalMode}

# Upstream's names (v1.0.1): llama.py's pte_filename per --model_mode, SimpleADB's build paths.
PTE_NAMES: dict[str, str] = {EvalMode.KV: "kv_llama_qnn.pte", EvalMode.HYBRID: "hybrid_llama_qnn.pte",
                             EvalMode.LOOKAHEAD: "lookahead_llama_qnn.pte"}
RUNNER_NAME = "qnn_llama_runner"
RUNNER_IN_BUILD = "examples/qualcomm/oss_scripts/llama/" + RUNNER_NAME
BACKEND_LIB_NAME = "libqnn_executorch_backend.so"
BACKEND_IN_BUILD = "backends/qualcomm/" + BACKEND_LIB_NAME
# The tokenizer files qnn_llama_runner v1.0.1 loads, as llama.py names them: HF save_pretrained's
# tokenizer.json, llama3_2's tiktoken tokenizer.model, stories' llama2c tokenizer.bin.
TOKENIZER_NAMES = ("tokenizer.json", "tokenizer.model", "tokenizer.bin")
EVICTOR_NAME = "attention_sink_evictor.pte"  # llama.py v1.4.1:724 (decoder_constants ATTENTION_SINK_EVICTOR)


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
    attention_sink_rope: Path | None = None  # the evictor, given to every mode's runs past the context
    context_len: int | None = None  # llama.py --max_context_len: the manifest's model.max_context_len


@dataclass(frozen=True)
class QnnSdk:
    """Where the QNN libraries are: an SDK root (``lib/aarch64-android``, ``lib/hexagon-vNN/unsigned``)
    or a flat folder holding them by name."""

    root: Path
    flat: bool

    @classmethod
    def at(cls, root: Path) -> QnnSdk:
        if (root / "lib" / "aarch64-android").is_dir():
            return cls(root, flat=False)
        if (root / "libQnnHtp.so").is_file():
            return cls(root, flat=True)
        raise UsageError(f"--qnn-sdk: {root} is neither a QNN SDK root (no lib/aarch64-android) nor a "
                         f"folder of its libraries (no libQnnHtp.so)")

    def android(self, name: str) -> Path:
        return self.root / name if self.flat else self.root / "lib" / "aarch64-android" / name

    def stub(self, n: str) -> Path:
        return self.android(f"libQnnHtpV{n}Stub.so")

    def skel(self, n: str) -> Path:
        name = f"libQnnHtpV{n}Skel.so"
        return self.root / name if self.flat else self.root / "lib" / f"hexagon-v{n}" / "unsigned" / name

    def needed(self, archs: list[str]) -> list[tuple[Path, str | None]]:
        """(path, htp_arch) of every library a manifest needs: the common ones, each arch's Stub and
        Skel, and the optional ones this SDK has."""
        libs: list[tuple[Path, str | None]] = [(self.android(lib), None) for lib in COMMON_SDK_LIBS]
        for arch in archs:
            n = arch_number(arch)
            libs += [(self.stub(n), f"v{n}"), (self.skel(n), f"v{n}")]
        libs += [(self.android(lib), None) for lib in OPTIONAL_SDK_LIBS if self.android(lib).is_file()]
        return libs


def arch_number(arch: str) -> str:
    n = arch.removeprefix("v")
    if not n.isdigit():
        raise UsageError(f"--htp-arch: {arch!r} is not an HTP arch such as v75")
    return n


def _existing(path: Path, what: str) -> Path:
    if not path.is_file():
        raise UsageError(f"{what}: {path} does not exist")
    return path


def sdk_libs(sdk: Path, arch: str) -> list[tuple[Path, str | None]]:
    """(path, htp_arch) of the QNN SDK libraries specific to one HTP arch: its Stub and Skel."""
    n = arch_number(arch)
    found = QnnSdk.at(sdk)
    return [(_existing(found.stub(n), "--qnn-sdk"), f"v{n}"),
            (_existing(found.skel(n), "--qnn-sdk"), f"v{n}")]


# -- finding the files by upstream's names ------------------------------------------------------------

def find_ptes(artifact: Path) -> dict[str, Path]:
    """The programs llama.py wrote into its artifact folder, by mode: ``kv_llama_qnn.pte`` and the
    like, or one model's prefixed name (``stories260k_kv_llama_qnn.pte``)."""
    if not artifact.is_dir():
        raise UsageError(f"--artifact: {artifact} is not a directory")
    ptes: dict[str, Path] = {}
    for mode, name in PTE_NAMES.items():
        found = sorted(p for p in artifact.iterdir()
                       if p.is_file() and (p.name == name or p.name.endswith("_" + name)))
        if len(found) > 1:
            raise UsageError(f"--artifact: {artifact} holds {len(found)} {mode} programs "
                             f"({', '.join(p.name for p in found)}); choose one with --pte {mode}=FILE")
        if found:
            ptes[mode] = found[0]
    if not ptes:
        raise UsageError(f"--artifact: {artifact} holds none of {', '.join(PTE_NAMES.values())} "
                         f"(llama.py's names); name the programs with --pte MODE=FILE")
    return ptes


def find_evictor(artifact: Path) -> Path | None:
    """The attention-sink evictor llama.py 1.4.1 wrote beside the programs, if it did."""
    path = artifact / EVICTOR_NAME
    return path if path.is_file() else None


def find_tokenizer(artifact: Path) -> Path:
    """The runtime tokenizer in the artifact folder, by the names llama.py gives it."""
    found = [artifact / n for n in TOKENIZER_NAMES if (artifact / n).is_file()]
    if not found:
        raise UsageError(f"--artifact: {artifact} holds none of {', '.join(TOKENIZER_NAMES)}; name "
                         f"the runtime tokenizer with --tokenizer (llama3_2 and stories keep theirs "
                         f"outside the artifact folder)")
    if len(found) > 1:
        raise UsageError(f"--artifact: {artifact} holds several tokenizers "
                         f"({', '.join(p.name for p in found)}); choose one with --tokenizer")
    return found[0]


def find_in_build(build: Path, upstream_path: str, what: str) -> Path:
    """A build output where SimpleADB takes it (``build/<upstream_path>``), or flat in ``build``."""
    for path in (build / upstream_path, build / Path(upstream_path).name):
        if path.is_file():
            return path
    raise UsageError(f"--build-folder: {build} has no {upstream_path} (nor {Path(upstream_path).name} "
                     f"at its top); name it with {what}")


# -- the manifest ---------------------------------------------------------------------------------------

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
    for path, htp in QnnSdk.at(a.qnn_sdk).needed(a.htp_archs):
        files.append(describe_file(base, _existing(path, "--qnn-sdk"), role="qnn_lib", htp_arch=htp))
    for path in a.extra:
        files.append(describe_file(base, _existing(path, "--extra"), role="other"))
    if a.context_len is not None and a.context_len < 2:
        raise UsageError(f"--context-len: {a.context_len} is not a context length (at least 2)")
    if a.attention_sink_rope is not None:
        if a.context_len is None:
            raise UsageError(f"--attention-sink-rope {a.attention_sink_rope}: give the model's context "
                             f"too (--context-len, llama.py's --max_context_len): the evictor is "
                             f"given only to runs past it")
        files.append(describe_file(base, _existing(a.attention_sink_rope, "--attention-sink-rope"),
                                   role="other"))
        modes = {k: replace(m, attention_sink_rope=a.attention_sink_rope.name) for k, m in modes.items()}
    seen: dict[tuple[str, str | None], Path] = {}
    for f in files:
        key = (f.name, f.htp_arch)
        if key in seen:
            raise UsageError(f"two files would land as {f.name!r} in the workspace: {seen[key]} and "
                             f"{f.path}")
        seen[key] = f.path
    bundle = Bundle(name=a.name, runner_dialect=a.dialect, tokenizer=a.tokenizer.name, files=files,
                    modes=modes, decoder_model_version=a.decoder_model_version, runner=a.runner.name,
                    model={} if a.context_len is None else {"max_context_len": a.context_len})
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    bundle.write(manifest_path)
    return bundle


# -- what a phone can load ----------------------------------------------------------------------------

ELF_MAGIC = b"\x7fELF"
EM_AARCH64 = 183


def not_an_android_binary(path: Path) -> str | None:
    """Why a phone's linker would refuse ``path`` (the runner, the backend library, an aarch64-android
    QNN library), or None: not an ELF file (a Git LFS pointer, an HTML page), or one for another
    machine (a runner of the x86_64 build)."""
    try:
        with path.open("rb") as f:
            head = f.read(20)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if head[:4] != ELF_MAGIC:
        return f"is not an ELF file (it starts with {head[:16]!r})"
    if len(head) == 20 and head[5] == 1 and int.from_bytes(head[18:20], "little") != EM_AARCH64:
        return f"is an ELF file for machine {int.from_bytes(head[18:20], 'little')}, not aarch64 (183)"
    return None
