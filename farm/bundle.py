"""Bundle manifests: the list of files a model needs on a device, with sizes and digests.

A manifest is JSON, written by ``farm export`` for the reference llama or by hand for real QNN
artifacts. Paths of files are relative to the manifest's directory; ``name`` is where the file lands
in the device workspace (flat, as upstream's SimpleADB pushes them) and must stay inside it.

    {
      "format": "ptefarm-bundle/1",
      "name": "reference-tiny",
      "runner_dialect": "host" | "qnn-v1.0" | "qnn-shared-buffer",
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
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import UsageError
from farm.fileio import write_atomic

FORMAT = "ptefarm-bundle/1"
DIALECTS = ("host", "qnn-v1.0", "qnn-shared-buffer")
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


@dataclass(frozen=True)
class Mode:
    pte: str
    eval_mode: int
    ar_len: int


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

    def files_for(self, htp_arch: str | None) -> list[BundleFile]:
        """The files a device of this HTP arch receives: common files plus its own QNN libraries."""
        return [f for f in self.files if f.htp_arch is None or f.htp_arch == htp_arch]

    def htp_archs(self) -> set[str]:
        return {f.htp_arch for f in self.files if f.htp_arch}

    def to_json(self, base: Path) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "runner_dialect": self.runner_dialect,
            "decoder_model_version": self.decoder_model_version,
            "tokenizer": self.tokenizer,
            "runner": self.runner,
            "modes": {k: asdict(m) for k, m in self.modes.items()},
            "model": self.model,
            "files": [f.to_json(base) for f in self.files],
        }

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
                      sha256=sha256_file(path), role=role, htp_arch=htp_arch)


def check_workspace_name(name: Any, where: str) -> str:
    """A workspace name must be a relative path that stays inside the workspace."""
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: file name must be a non-empty string, got {name!r}")
    if "\0" in name or "\n" in name:
        raise UsageError(f"{where}: file name {name!r} contains a NUL or newline")
    if name.startswith("/") or posixpath.isabs(name):
        raise UsageError(f"{where}: file name {name!r} is absolute; it must stay inside the workspace")
    parts = name.split("/")
    if ".." in parts or posixpath.normpath(name).startswith(".."):
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


def load(manifest_path: str | os.PathLike, *, verify: bool = False) -> Bundle:
    """Read and validate a manifest. ``verify`` also re-hashes every file (slow for big files)."""
    manifest_path = Path(manifest_path)
    where = str(manifest_path)
    try:
        raw = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{where}: manifest not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{where}: cannot read manifest: {e}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{where}: not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: manifest must be a JSON object")
    fmt = raw.get("format")
    if fmt != FORMAT:
        raise UsageError(f"{where}: field 'format' is {fmt!r}, expected {FORMAT!r}")
    dialect = _require(raw, "runner_dialect", str, where)
    if dialect not in DIALECTS:
        raise UsageError(f"{where}: field 'runner_dialect' is {dialect!r}, expected one of {DIALECTS}")
    base = manifest_path.parent.resolve()
    files: list[BundleFile] = []
    seen: set[tuple[str, str | None]] = set()
    for i, entry in enumerate(_require(raw, "files", list, where)):
        fwhere = f"{where}: files[{i}]"
        if not isinstance(entry, dict):
            raise UsageError(f"{fwhere}: must be an object")
        name = check_workspace_name(entry.get("name"), fwhere)
        rel = entry.get("path", name)
        if not isinstance(rel, str):
            raise UsageError(f"{fwhere}: field 'path' must be a string")
        path = (base / rel).resolve()
        size = _require(entry, "size", int, fwhere)
        digest = _require(entry, "sha256", str, fwhere)
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise UsageError(f"{fwhere}: field 'sha256' is not a lowercase hex sha256")
        role = entry.get("role", "other")
        if role not in ROLES:
            raise UsageError(f"{fwhere}: field 'role' is {role!r}, expected one of {ROLES}")
        htp_arch = entry.get("htp_arch")
        if htp_arch is not None and not (isinstance(htp_arch, str) and htp_arch.startswith("v")):
            raise UsageError(f"{fwhere}: field 'htp_arch' is {htp_arch!r}, expected like 'v75'")
        if (name, htp_arch) in seen:
            raise UsageError(f"{fwhere}: duplicate file name {name!r}")
        seen.add((name, htp_arch))
        if not path.is_file():
            raise UsageError(f"{fwhere}: file {path} does not exist")
        actual = path.stat().st_size
        if actual != size:
            raise UsageError(f"{fwhere}: {path} is {actual} bytes, manifest says {size}")
        if verify and sha256_file(path) != digest:
            raise UsageError(f"{fwhere}: {path} does not match its sha256 in the manifest")
        files.append(BundleFile(name=name, path=path, size=size, sha256=digest, role=role,
                                htp_arch=htp_arch))
    names = {f.name for f in files}
    modes: dict[str, Mode] = {}
    for key, m in _require(raw, "modes", dict, where).items():
        mwhere = f"{where}: modes.{key}"
        if not isinstance(m, dict):
            raise UsageError(f"{mwhere}: must be an object")
        pte = _require(m, "pte", str, mwhere)
        if pte not in names:
            raise UsageError(f"{mwhere}: pte {pte!r} is not among the manifest's files")
        eval_mode = _require(m, "eval_mode", int, mwhere)
        if eval_mode not in (0, 1, 2):
            raise UsageError(f"{mwhere}: field 'eval_mode' is {eval_mode}, expected 0, 1 or 2")
        modes[key] = Mode(pte=pte, eval_mode=eval_mode, ar_len=int(m.get("ar_len", 1)))
    if not modes:
        raise UsageError(f"{where}: field 'modes' is empty")
    tokenizer = _require(raw, "tokenizer", str, where)
    if tokenizer not in names:
        raise UsageError(f"{where}: tokenizer {tokenizer!r} is not among the manifest's files")
    runner = raw.get("runner")
    if dialect == "host":
        if runner is not None:
            raise UsageError(f"{where}: field 'runner' must be absent for the host runner dialect")
    elif not isinstance(runner, str) or runner not in names:
        raise UsageError(f"{where}: field 'runner' must name one of the manifest's files "
                         f"for dialect {dialect!r}")
    return Bundle(name=str(raw.get("name", manifest_path.parent.name)), runner_dialect=dialect,
                  tokenizer=tokenizer, files=files, modes=modes, runner=runner,
                  decoder_model_version=str(raw.get("decoder_model_version", "llama3")),
                  model=dict(raw.get("model") or {}), manifest_path=manifest_path.resolve())
