"""Content-defined chunks of a bundle file, as a chunked deploy pushes them (farm.execute.chunkstore).

A rebuild of a model is not byte-identical to the last build, yet most of its bytes are: the weights
are the same and sit at other offsets. Cutting a file where its content says (FastCDC's gear hash,
the ``fastcdc`` wheel: a maintained C implementation, 1.3 GB/s here) rather than every N bytes makes
an insertion move one or two chunk boundaries, not all of them, so the chunks of the new file are
mostly chunks the device already holds.

The sizes are chosen for phones: chunks of 256 KiB on average (64 KiB to 1 MiB) make a 2 GB .pte
about 8,000 chunks, which is 8,000 files on the device and a few dozen shell commands to assemble,
while a changed graph or a changed tensor costs a chunk or two around it (a quarter to half a
megabyte), a few percent of a program's bytes. Files below ``min_file_bytes`` (a tokenizer, a small
library) are pushed whole: their chunks would be most of them anyway.

A file is chunked once per process and identity (size, mtime, ctime, inode), as the bundle's digests
are (``farm.bundle.manifest.cached_digest``): each device's deploy of the same bundle reuses it.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from farm.bundle.manifest import RACY_NS, file_identity
from farm.config import DEFAULT_CHUNK_MIN_BYTES, DEFAULT_CHUNK_STORE_BYTES, DeployConfig
from farm.errors import UsageError

log = logging.getLogger(__name__)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
MIN_BYTES_ENV = "PTEFARM_CHUNK_MIN_BYTES"  # a size in bytes, or "off": no file is chunked


@dataclass(frozen=True)
class ChunkPolicy:
    """Which files a deploy pushes as chunks and how they are cut; how big the device's store may
    grow (chunks that a deployed file needs stay beyond it: see farm.execute.chunkstore)."""
    min_file_bytes: int | None = DEFAULT_CHUNK_MIN_BYTES  # None: chunk nothing
    min_chunk: int = 64 * KiB
    avg_chunk: int = 256 * KiB
    max_chunk: int = 1 * MiB
    store_bytes: int = DEFAULT_CHUNK_STORE_BYTES

    def chunks(self, size: int) -> bool:
        return self.min_file_bytes is not None and size >= max(self.min_file_bytes, 1)

    @classmethod
    def configured(cls, deploy: DeployConfig, env: dict[str, str] | None = None) -> ChunkPolicy:
        """The config's ``[deploy]`` policy, with ``PTEFARM_CHUNK_MIN_BYTES`` over it if set."""
        return cls.from_env(env, base=cls(min_file_bytes=deploy.chunk_min_bytes,
                                          store_bytes=deploy.chunk_store_bytes))

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, *,
                 base: ChunkPolicy | None = None) -> ChunkPolicy:
        """``base`` (default: the defaults) with ``PTEFARM_CHUNK_MIN_BYTES`` (bytes, or "off") if
        set."""
        base = base or cls()
        value = (os.environ if env is None else env).get(MIN_BYTES_ENV, "").strip()
        if not value:
            return base
        if value.lower() == "off":
            return replace(base, min_file_bytes=None)
        try:
            n = int(value)
        except ValueError:
            raise UsageError(f"{MIN_BYTES_ENV}={value!r}: expected a size in bytes or 'off'") from None
        if n < 0:
            raise UsageError(f"{MIN_BYTES_ENV}={value!r}: a size cannot be negative")
        return replace(base, min_file_bytes=n)


PLAIN = ChunkPolicy(min_file_bytes=None)


@dataclass(frozen=True)
class Chunk:
    offset: int
    size: int
    sha256: str  # also its name in the device's store


@dataclass(frozen=True)
class FileChunks:
    path: Path
    size: int
    sha256: str  # of the whole file, as read for chunking
    chunks: tuple[Chunk, ...]
    identity: tuple[int, int, int, int, int]  # the file's when it was read; a push checks it again

    def unchanged(self) -> bool:
        """Whether the host file is still the one these chunks were cut from."""
        try:
            return file_identity(os.stat(self.path)) == self.identity
        except OSError:
            return False

    def unique(self) -> dict[str, Chunk]:
        """Each distinct chunk once (a file can repeat itself: zero padding, tied embeddings)."""
        seen: dict[str, Chunk] = {}
        for c in self.chunks:
            seen.setdefault(c.sha256, c)
        return seen


_cache: dict[tuple[str, tuple[int, int, int, int, int], tuple[int, int, int]], FileChunks] = {}
_cache_lock = threading.Lock()


def chunk_file(path: Path, policy: ChunkPolicy, *, file_digest: str | None = None) -> FileChunks:
    """Cut ``path`` into content-defined chunks and hash each (and the whole file, unless
    ``file_digest``, a digest already taken of these very bytes, is given). ``OSError`` if the file
    cannot be read; a file that changed while it was read is read again (once), then refused with
    ``OSError`` as a file still being written."""
    from fastcdc import fastcdc  # the C extension; imported only by a deploy that chunks

    params = (policy.min_chunk, policy.avg_chunk, policy.max_chunk)
    for _attempt in range(2):
        started = time.time_ns()
        before = os.stat(path)
        key = (str(path), file_identity(before), params)
        with _cache_lock:
            hit = _cache.get(key)
        if hit is not None:
            return hit
        whole = None if file_digest is not None else hashlib.sha256()
        chunks: list[Chunk] = []
        with open(path, "rb") as f:
            if before.st_size == 0:
                raise OSError(f"{path}: an empty file has no chunks")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                view = memoryview(mm)
                # The whole file's digest on a thread of its own (hashlib lets go of the GIL on
                # big buffers) while this one cuts and hashes the chunks: the file is read once.
                hasher = (threading.Thread(target=whole.update, args=(view,), name="chunk-sha256")
                          if whole is not None else None)
                try:
                    if hasher is not None:
                        hasher.start()
                    for c in fastcdc(view, min_size=policy.min_chunk, avg_size=policy.avg_chunk,
                                     max_size=policy.max_chunk):
                        piece = view[c.offset:c.offset + c.length]
                        chunks.append(Chunk(c.offset, c.length, hashlib.sha256(piece).hexdigest()))
                        piece.release()
                finally:
                    if hasher is not None:
                        hasher.join()
                    view.release()
        after = os.stat(path)
        if file_identity(after) == file_identity(before):
            result = FileChunks(Path(path), before.st_size,
                                file_digest if whole is None else whole.hexdigest(),
                                tuple(chunks), file_identity(before))
            if max(before.st_mtime_ns, before.st_ctime_ns) < started - RACY_NS:
                with _cache_lock:  # only a settled file: one rewritten within its clock tick is not
                    _cache[key] = result
            return result
        log.info("%s changed while it was chunked; reading it again", path)
    raise OSError(f"{path} keeps changing while it is read (a build still writing it?)")


def forget() -> None:
    """Drop the process's chunk lists (tests that rewrite a file in place with its identity kept)."""
    with _cache_lock:
        _cache.clear()
