"""Bundle manifests: the list of files a model needs on a device, with sizes and digests.

A manifest is JSON, written by ``farm export`` for the reference llama or by ``farm bundle create`` for
real QNN artifacts. ``path`` of a file is relative to the manifest's directory and must stay inside it
(also through symlinks): a manifest cannot make the farm read, hash or push any other host file.
``name`` is where the file lands in the device workspace (flat, as upstream's SimpleADB pushes them)
and must stay inside it. ``verify_bundle`` checks sizes and sha256 (cached per process).

    {
      "format": "ptefarm-bundle/1",
      "name": "reference-tiny",
      "runner_dialect": "host" | "qnn-v1.0" | "qnn-v1.4" | "auto",  # absent: auto (QNN)
      "decoder_model_version": "llama3",
      "tokenizer": "tokenizer.model",
      "runner": "qnn_llama_runner",              # a file name, absent for the host runner
      "modes": {"kv": {"pte": "kv_llama.pte", "eval_mode": 0, "ar_len": 1},
                "hybrid": {"pte": "hybrid_llama.pte", "eval_mode": 1, "ar_len": 32}},
      "model": {... the model config, free-form ...},
      "files": [{"name": "kv_llama.pte", "path": "kv_llama.pte", "size": 123, "sha256": "...",
                 "role": "pte", "htp_arch": null}, ...]
    }

``htp_arch`` (e.g. "v75") marks a QNN library that only devices of that HTP arch receive.

``runner_dialect`` ``auto`` (the default for a manifest with a ``runner``) leaves the dialect to the runner
itself: its ``--help`` on the device tells (farm.execute.runprofile.detect_dialect). Without a ``runner``, ``auto``
means the host runner ``farm-llama-runner``, asked the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import stat as stat_mod
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from farm.config import read_text
from farm.errors import UsageError
from farm.fileio import write_atomic
from farm.vocab import EVAL_MODE_NUMBERS, Dialect, EvalMode

FORMAT = "ptefarm-bundle/1"
DIALECTS: tuple[Dialect, ...] = tuple(Dialect)
AUTO_DIALECT = "auto"  # read from the runner's --help on the device (farm.execute.runprofile.detect_dialect)
MANIFEST_DIALECTS: tuple[str, ...] = (*DIALECTS, AUTO_DIALECT)
DIALECT_ALIASES = {"qnn-shared-buffer": "qnn-v1.4"}  # its name before the farm spoke v1.4.1
HOST_RUNNER = "farm-llama-runner"  # the runner of dialect host, on every device's PATH
CONTEXT_KEYS = ("max_seq_len", "max_context_len", "context_len")  # model fields naming the context
ROLES = ("pte", "tokenizer", "runner", "backend_lib", "qnn_lib", "other")


@dataclass(frozen=True)
class BundleFile:
    name: str  # path inside the device workspace
    path: Path  # absolute path on the host
    size: int
    sha256: str
    role: str = "other"
    htp_arch: str | None = None

    def to_json(self, base: Path) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = os.path.relpath(self.path, base)
        return d


LOOKAHEAD_FIELDS = ("ngram", "window", "gcap")
LOOKAHEAD_EVAL_MODE = EVAL_MODE_NUMBERS[EvalMode.LOOKAHEAD]


@dataclass(frozen=True)
class Mode:
    pte: str
    eval_mode: int
    ar_len: int  # the prefill's (hybrid, lookahead): what a prompt is cut into chunks of
    # Lookahead decoding (eval_mode 2): the runner's --ngram/--window/--gcap, fixed by the export
    # (its kv_forward has ar_len next_power_of_two((window + gcap) * (ngram - 1))). None otherwise,
    # or for a lookahead mode whose manifest leaves them to the runner's defaults.
    ngram: int | None = None
    window: int | None = None
    gcap: int | None = None
    # The attention-sink evictor beside the .pte (a file of the manifest, farm/bundle/export_sink.py):
    # qnn_llama_runner v1.4.1's --attention_sink_rope_path, given only to a run that generates past the
    # context window (with it the runner evicts instead of stopping, runner.cpp v1.4.1:393-409), so a
    # run within the context is the same with or without it. None: the mode has none.
    attention_sink_rope: str | None = None

    @property
    def attention_sink_args(self) -> list[str]:
        return [] if self.attention_sink_rope is None else ["--attention_sink_rope_path",
                                                            self.attention_sink_rope]

    @property
    def lookahead_args(self) -> list[str]:
        if self.ngram is None:
            return []
        return ["--ngram", str(self.ngram), "--window", str(self.window), "--gcap", str(self.gcap)]

    @property
    def decode_ar_len(self) -> int:
        """The ar_len of the decode method: 1, or for lookahead what upstream's llama.py exports,
        next_power_of_two((window + gcap) * (ngram - 1)). Its cache holds context - decode_ar_len
        entries, so a lookahead run ends that much sooner than a hybrid one."""
        if self.ngram is None or self.window is None or self.gcap is None:
            return 1
        rows = (self.window + self.gcap) * (self.ngram - 1)
        return 1 << (rows - 1).bit_length()

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


MODALITIES = ("vision", "audio")
# qnn_multimodal_runner's flag for each modality's input list (decoder_constants.py v1.4.1:24-27)
MODALITY_FLAGS = {"vision": "image_path", "audio": "audio_path"}


@dataclass(frozen=True)
class Multimodal:
    """A vision- or audio-language bundle, run by qnn_multimodal_runner (ExecuTorch 1.4.1): its modes'
    .pte is the text decoder (``--decoder_path``, input embeddings in place of tokens) and beside it
    the encoder (``--encoder_path``) and the token embedding (``--tok_embedding_path``). ``inputs``:
    name -> an input list file of the bundle (``--image_path`` / ``--audio_path``: raw float32 files
    named one per line, qnn_multimodal_runner's utils.h load_raw_files), for the suites to run with."""

    modality: str
    encoder: str
    tok_embedding: str
    inputs: dict[str, str] = field(default_factory=dict)

    @property
    def input_flag(self) -> str:
        return MODALITY_FLAGS[self.modality]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Bundle:
    name: str
    runner_dialect: str
    tokenizer: str
    files: list[BundleFile]
    modes: dict[str, Mode]
    decoder_model_version: str = "llama3"
    runner: str | None = None
    model: dict[str, Any] = field(default_factory=dict)
    manifest_path: Path | None = None
    multimodal: Multimodal | None = None  # a bundle of qnn_multimodal_runner; None: qnn_llama_runner's

    def files_for(self, htp_arch: str | None) -> list[BundleFile]:
        """The files a device of this HTP arch receives: common files plus its own QNN libraries."""
        return [f for f in self.files if f.htp_arch is None or f.htp_arch == htp_arch]

    def htp_archs(self) -> set[str]:
        return {f.htp_arch for f in self.files if f.htp_arch}

    def context(self) -> tuple[int, str] | None:
        """The model's context length and the manifest field that gives it (``model.max_seq_len``
        in the farm's exports), or None when the manifest does not say."""
        for key in CONTEXT_KEYS:
            value = self.model.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                return value, f"model.{key}"
        return None

    def to_json(self, base: Path) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "runner_dialect": self.runner_dialect,
            "decoder_model_version": self.decoder_model_version,
            "tokenizer": self.tokenizer,
            "runner": self.runner,
            "modes": {k: m.to_json() for k, m in self.modes.items()},
            "model": self.model,
            "files": [f.to_json(base) for f in self.files],
        } | ({"multimodal": self.multimodal.to_json()} if self.multimodal else {})

    def write(self, path: Path) -> None:
        """Write the manifest atomically (a reader never sees half a manifest)."""
        path = Path(path)
        write_atomic(path, json.dumps(self.to_json(path.parent), indent=2) + "\n")
        self.manifest_path = path


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def describe_file(base: Path, path: Path, *, role: str, name: str | None = None,
                  htp_arch: str | None = None) -> BundleFile:
    path = Path(path).resolve()
    return BundleFile(name=name or path.name, path=path, size=path.stat().st_size,
                      sha256=file_digest(path), role=role, htp_arch=htp_arch)


def check_workspace_name(name: Any, where: str) -> str:
    """A workspace name must be a relative path that stays inside the workspace."""
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: file name must be a non-empty string, got {name!r}")
    if "\0" in name or "\n" in name:
        raise UsageError(f"{where}: file name {name!r} contains a NUL or newline")
    if posixpath.isabs(name):
        raise UsageError(f"{where}: file name {name!r} is absolute; it must stay inside the workspace")
    if ".." in name.split("/"):  # refused even where it would stay inside: a name is plain
        raise UsageError(f"{where}: file name {name!r} escapes the workspace ('..')")
    if posixpath.normpath(name) in (".", ""):
        raise UsageError(f"{where}: file name {name!r} names the workspace itself")
    return posixpath.normpath(name)


def _require(obj: dict, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise UsageError(f"{where}: missing field '{key}'")
    value = obj[key]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise UsageError(f"{where}: field '{key}' has the wrong type ({type(value).__name__})")
    return value


def _object(value: Any, where: str) -> dict:
    """A manifest entry that must be a JSON object (a file, a mode, the multimodal section)."""
    if not isinstance(value, dict):
        raise UsageError(f"{where}: must be an object, got {type(value).__name__}")
    return value


def _optional(obj: dict, key: str, typ: type | tuple[type, ...], default: Any, where: str) -> Any:
    """An optional field: absent (or null) gives ``default``, present must have the right type."""
    if obj.get(key) is None:
        return default
    return _require(obj, key, typ, where)


def _read_manifest(manifest_path: Path, where: str) -> Any:
    text = read_text(manifest_path, "manifest", max_bytes=None, bad_byte_at="offset")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{where}: not valid JSON: {e}") from None
    except RecursionError:
        raise UsageError(f"{where}: not valid JSON: nested too deeply") from None


def _inside(path: Path, base: Path) -> bool:
    return path == base or path.is_relative_to(base)


def _host_path(base: Path, rel: Any, fwhere: str) -> Path:
    """The host file of a ``files[i].path``: relative to the manifest's directory and inside it, also
    after following symlinks."""
    if not isinstance(rel, str) or not rel:
        raise UsageError(f"{fwhere}: field 'path' must be a non-empty string, got {rel!r}")
    if "\0" in rel:
        raise UsageError(f"{fwhere}: field 'path' {rel!r} contains a NUL byte")
    if os.path.isabs(rel):
        raise UsageError(f"{fwhere}: field 'path' {rel!r} is absolute; files must be inside the "
                         f"manifest's directory {base}")
    try:
        path = (base / rel).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise UsageError(f"{fwhere}: field 'path' {rel!r} cannot be resolved: {e}") from None
    if not _inside(path, base):
        raise UsageError(f"{fwhere}: field 'path' {rel!r} resolves to {path}, outside the manifest's "
                         f"directory {base}")
    return path


def _not_a_file(path: Path) -> str:
    """Why ``path`` is not a bundle file, for an error message: missing, a directory or special."""
    if path.is_dir():
        return f"{path} is a directory, not a file"
    if path.exists():
        return f"{path} is not a regular file"
    return f"file {path} does not exist"


def load(manifest_path: str | os.PathLike, *, verify: bool = False) -> Bundle:
    """Read and validate a manifest; every error is one ``UsageError`` naming the file and field.

    Every file must exist inside the manifest's directory with the manifest's size. ``verify`` also
    checks the sha256 of every file (``verify_bundle``: hashed once per process while unchanged).
    """
    manifest_path = Path(manifest_path)
    where = str(manifest_path)
    raw = _read_manifest(manifest_path, where)
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: manifest must be a JSON object")
    fmt = raw.get("format")
    if fmt != FORMAT:
        raise UsageError(f"{where}: field 'format' is {fmt!r}, expected {FORMAT!r}")
    if raw.get("runner_dialect") is None and raw.get("runner") is not None:
        dialect = AUTO_DIALECT  # a QNN runner can tell its own dialect
    else:
        dialect = _require(raw, "runner_dialect", str, where)
    dialect = DIALECT_ALIASES.get(dialect, dialect)
    if dialect not in MANIFEST_DIALECTS:
        raise UsageError(f"{where}: field 'runner_dialect' is {dialect!r}, expected one of "
                         f"{', '.join(MANIFEST_DIALECTS)}")
    name_field = _optional(raw, "name", str, manifest_path.parent.name, where)
    decoder = _optional(raw, "decoder_model_version", str, "llama3", where)
    model = _optional(raw, "model", dict, {}, where)
    base = manifest_path.parent.resolve()
    files: list[BundleFile] = []
    seen: set[tuple[str, str | None]] = set()
    for i, entry in enumerate(_require(raw, "files", list, where)):
        fwhere = f"{where}: files[{i}]"
        entry = _object(entry, fwhere)
        name = check_workspace_name(entry.get("name"), fwhere)
        path = _host_path(base, entry.get("path", name), fwhere)
        size = _require(entry, "size", int, fwhere)
        if size < 0:
            raise UsageError(f"{fwhere}: field 'size' is negative ({size})")
        digest = _require(entry, "sha256", str, fwhere)
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise UsageError(f"{fwhere}: field 'sha256' is not a lowercase hex sha256")
        role = _optional(entry, "role", str, "other", fwhere)
        if role not in ROLES:
            raise UsageError(f"{fwhere}: field 'role' is {role!r}, expected one of {ROLES}")
        htp_arch = entry.get("htp_arch")
        if htp_arch is not None and not (isinstance(htp_arch, str) and htp_arch.startswith("v")):
            raise UsageError(f"{fwhere}: field 'htp_arch' is {htp_arch!r}, expected like 'v75'")
        if (name, htp_arch) in seen:
            raise UsageError(f"{fwhere}: duplicate file name {name!r}")
        seen.add((name, htp_arch))
        if not path.is_file():
            raise UsageError(f"{fwhere}: {_not_a_file(path)}")
        actual = path.stat().st_size
        if actual != size:
            raise UsageError(f"{fwhere}: {path} is {actual} bytes, manifest says {size}")
        files.append(BundleFile(name=name, path=path, size=size, sha256=digest, role=role,
                                htp_arch=htp_arch))
    names = {f.name for f in files}
    modes: dict[str, Mode] = {}
    for key, m in _require(raw, "modes", dict, where).items():
        mwhere = f"{where}: modes.{key}"
        m = _object(m, mwhere)
        pte = _require(m, "pte", str, mwhere)
        if pte not in names:
            raise UsageError(f"{mwhere}: pte {pte!r} is not among the manifest's files")
        eval_mode = _require(m, "eval_mode", int, mwhere)
        if eval_mode not in EVAL_MODE_NUMBERS.values():
            raise UsageError(f"{mwhere}: field 'eval_mode' is {eval_mode}, expected "
                             f"{', '.join(str(n) for n in EVAL_MODE_NUMBERS.values())}")
        ar_len = _optional(m, "ar_len", int, 1, mwhere)
        if ar_len < 1:
            raise UsageError(f"{mwhere}: field 'ar_len' must be positive, got {ar_len}")
        lookahead = {name: _optional(m, name, int, None, mwhere) for name in LOOKAHEAD_FIELDS}
        given = [name for name, value in lookahead.items() if value is not None]
        if eval_mode == LOOKAHEAD_EVAL_MODE and given:  # none: the runner's own defaults apply
            for name, value in lookahead.items():
                if value is None or value < 1:
                    raise UsageError(f"{mwhere}: field {name!r} must be a positive integer beside "
                                     f"{', '.join(repr(g) for g in given if g != name)} (the "
                                     f"runner's --{name}, as the .pte was exported for), got {value!r}")
        elif given and eval_mode != LOOKAHEAD_EVAL_MODE:
            raise UsageError(f"{mwhere}: field {given[0]!r} is for lookahead decoding (eval_mode "
                             f"{LOOKAHEAD_EVAL_MODE}), not eval_mode {eval_mode}")
        sink = _optional(m, "attention_sink_rope", str, None, mwhere)
        if sink is not None and sink not in names:
            raise UsageError(f"{mwhere}: attention_sink_rope {sink!r} is not among the manifest's files")
        modes[key] = Mode(pte=pte, eval_mode=eval_mode, ar_len=ar_len, **lookahead,
                          attention_sink_rope=sink)
    if not modes:
        raise UsageError(f"{where}: field 'modes' is empty")
    tokenizer = _require(raw, "tokenizer", str, where)
    if tokenizer not in names:
        raise UsageError(f"{where}: tokenizer {tokenizer!r} is not among the manifest's files")
    runner = raw.get("runner")
    if dialect == Dialect.HOST:
        if runner is not None:
            raise UsageError(f"{where}: field 'runner' must be absent for the host runner dialect")
    elif dialect == AUTO_DIALECT and runner is None:
        pass  # the host runner, asked for its dialect like any other
    elif not isinstance(runner, str) or runner not in names:
        raise UsageError(f"{where}: field 'runner' must name one of the manifest's files "
                         f"for dialect {dialect!r}")
    multimodal = _multimodal(raw.get("multimodal"), names, where)
    bundle = Bundle(name=name_field, runner_dialect=dialect, tokenizer=tokenizer, files=files,
                    modes=modes, runner=runner, decoder_model_version=decoder, model=dict(model),
                    manifest_path=manifest_path.resolve(), multimodal=multimodal)
    if verify:
        verify_bundle(bundle)
    return bundle


def _multimodal(raw: Any, names: set[str], where: str) -> Multimodal | None:
    if raw is None:
        return None
    mwhere = f"{where}: multimodal"
    raw = _object(raw, mwhere)
    modality = _require(raw, "modality", str, mwhere)
    if modality not in MODALITIES:
        raise UsageError(f"{mwhere}: field 'modality' is {modality!r}, not one of {', '.join(MODALITIES)}")
    files = {key: _require(raw, key, str, mwhere) for key in ("encoder", "tok_embedding")}
    inputs = _optional(raw, "inputs", dict, {}, mwhere)
    for key, name in [*files.items(), *((f"inputs.{k}", v) for k, v in inputs.items())]:
        if not isinstance(name, str) or name not in names:
            raise UsageError(f"{mwhere}: field {key!r} ({name!r}) is not among the manifest's files")
    return Multimodal(modality=modality, inputs=dict(inputs), **files)


# (path, size, mtime_ns, ctime_ns, inode, device) -> sha256 of the content at that identity
RACY_NS = 1_000_000_000  # file times are coarse: a file changed this recently may change again unseen
_digest_cache: dict[tuple[str, int, int, int, int, int], str] = {}
_digest_lock = threading.Lock()


def file_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What says a file is the one it was (size, mtime, ctime, inode, device), from its ``os.stat``:
    a write moves its times, a replacement its inode."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _identity(path: Path, st: os.stat_result) -> tuple[str, int, int, int, int, int]:
    return (str(path), *file_identity(st))


def file_digest(path: Path) -> str:
    """sha256 of a host file, cached per process by (path, size, mtime_ns, ctime_ns, inode): a file
    unchanged since it was last hashed is not read again. Not cached: a file that changed while being
    hashed, or that changed less than ``RACY_NS`` before (a write in the same clock tick would not move
    its times: "racily clean", as git calls it)."""
    before = os.stat(path)
    key = _identity(path, before)
    with _digest_lock:
        cached = _digest_cache.get(key)
    if cached is not None:
        return cached
    started = time.time_ns()
    digest = sha256_file(path)
    if _identity(path, os.stat(path)) == key:
        remember_digest(path, before, digest, since_ns=started)
    return digest


def cached_digest(path: Path, st: os.stat_result) -> str | None:
    """The sha256 ``file_digest`` already took of ``path`` at the identity ``st`` (an ``os.stat`` of
    it), or None: the file was not hashed in this process, or has changed since."""
    with _digest_lock:
        return _digest_cache.get(_identity(path, st))


def remember_digest(path: Path, st: os.stat_result, digest: str, *, since_ns: int) -> None:
    """Record ``digest`` as the content of ``path`` at identity ``st``, learned by reading the whole
    file (a deploy hashing what it streams) from ``since_ns`` (``time.time_ns()``) on, with the file at
    ``st`` before and after: cached only if it was settled then, as ``file_digest`` would."""
    if max(st.st_mtime_ns, st.st_ctime_ns) < since_ns - RACY_NS:
        with _digest_lock:
            _digest_cache[_identity(path, st)] = digest


def verify_bundle(bundle: Bundle) -> None:
    """Check every file of the bundle against the manifest: still inside the manifest's directory,
    a regular file, the manifest's size and sha256. ``UsageError`` names the file and, on a content
    mismatch, both digests. Cheap to repeat in one process (see ``file_digest``)."""
    where = str(bundle.manifest_path or bundle.name)
    base = Path(bundle.manifest_path).resolve().parent if bundle.manifest_path else None
    for i, f in enumerate(bundle.files):
        fwhere = f"{where}: files[{i}] ({f.name})"
        path = Path(f.path)
        try:
            resolved = path.resolve()
            st = os.stat(path)
        except (OSError, RuntimeError) as e:
            raise UsageError(f"{fwhere}: cannot read {path}: {getattr(e, 'strerror', None) or e}") \
                from None
        if base is not None and not _inside(resolved, base):
            raise UsageError(f"{fwhere}: {path} resolves to {resolved}, outside the manifest's "
                             f"directory {base}")
        if stat_mod.S_ISDIR(st.st_mode):
            raise UsageError(f"{fwhere}: {path} is a directory, not a file")
        if not stat_mod.S_ISREG(st.st_mode):
            raise UsageError(f"{fwhere}: {path} is not a regular file")
        if st.st_size != f.size:
            raise UsageError(f"{fwhere}: {path} is {st.st_size} bytes, manifest says {f.size} "
                             f"(truncated or replaced)")
        try:
            actual = file_digest(path)
        except OSError as e:
            raise UsageError(f"{fwhere}: cannot read {path}: {e.strerror or e}") from None
        if actual != f.sha256:
            raise UsageError(f"{fwhere}: {path} has sha256 {actual}, manifest says {f.sha256} "
                             f"(corrupted or changed)")
