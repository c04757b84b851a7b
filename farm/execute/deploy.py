"""Cached, content-addressed deployment of a bundle to a device workspace.

Upstream (SimpleADB) wipes the workspace and pushes every file on every run: a 1.3 GB .pte each time.
Here the device keeps a record (``.ptefarm-deploy.json`` in the bundle's workspace) of what it holds:
``{name: {sha256, size, mtime}}``. A deploy asks the device for the size and mtime of every file in one
shell call (a few, for thousands of files: no command is longer than ``COMMAND_BYTES``) and decides
per file:

- missing, or a size other than the manifest's: push;
- size and mtime equal to the record, and older than the record itself: trust the record (its sha256
  says whether the content is the manifest's); the file cannot have changed without moving its mtime;
- anything else (no record, mtime moved, or the file is as new as the record: "racily clean", as git
  calls it): hash it with the device's ``sha256sum`` (one call for all such files) and push on mismatch.

``verify="full"`` hashes every present file: it also catches a change that restored the size and mtime,
at the price of reading every byte on the device (seconds per GB on a phone). ``"fast"`` is the default
because the record is only ever wrong through deliberate tampering or a broken clock.

Each push goes to ``NAME.ptefarm-partial`` and is renamed by one ``mv`` after all pushes, so an
interrupted deploy never leaves a half file under a real name; the next deploy deletes the leftovers
(also an adbd's own temp files such as ``.NAME.ptefarm-partial.ptefarm-partial-PID``, left by a killed
device). Up to ``IN_FLIGHT`` files are pushed at once, biggest first, one sync connection each (kept
for the next file and the record: ``DeviceTransport.keep_sync``); a failure (or Ctrl-C) stops the
others at their next block, so their partial files are dropped too.

The record holds only digests the deploy knows for the bytes on the device: for a kept file the digest
the device's ``sha256sum`` reported or the previous record's; for a pushed file the sha256 of the host
file it streamed, from one of two places:

- the digest a verify took in this process (``farm.bundle.manifest.cached_digest``: the plugin verifies
  the bundle once before any lease), which counts only if the file's identity (size, mtime, ctime,
  inode) is the one that verify hashed and is the same after the push: the bytes hashed are then the
  bytes sent (the assumption the host digest cache makes, as git's index does, and only for a file
  settled when it was hashed);
- otherwise the bytes themselves, hashed as they are streamed: a reader thread per push reads the
  file once, a block ahead of the push, and hashes what it hands over (``_Source``), so ``farm deploy``
  verifies a new bundle in the same pass that pushes it instead of reading it twice; the digest then
  serves the next device's push (``remember_digest``) if the file was settled and did not change.

Files of ``ChunkPolicy.min_file_bytes`` and more (16 MiB; the config's ``[deploy]``) that must be
pushed go as content-defined chunks through the device's chunk store instead (farm.execute.chunking,
farm.execute.chunkstore): only the chunks the store lacks are sent, the file is assembled on the device
into the same partial name and renamed with the others only if the device's sha256 of it is the
manifest's, which is what the record then holds for it, with the list of its chunks (what the store's
eviction keeps). A device without room for the chunks and the assembled file gets whole files.

A host file whose bytes differ from the manifest's digest, or that changed during its push, is refused
(``UsageError`` naming it and both digests), its partial file removed, and it is not recorded.

The record is pushed to a temp name before the renames, and one shell command then removes the old
record, renames every pushed file into place, makes the runner executable and renames the new record:
its ``&&`` chain stops at the first failure, and the old record goes first, so a deploy stopped half-way
leaves no record that vouches for a file it replaced (a chain too long for one command is run as
several in turn, the old record out in the first, the new one in with the last). Pushed files get an mtime two seconds in the past
(the sync protocol lets the pusher choose it), which the record holds; the record itself is dated the
present: it is then strictly newer than every file, and any later edit on the device moves a file's
mtime away from the recorded one. Should a device ignore the pushed mtime, its files' mtimes differ
from the record's and the next deploy hashes them once and rewrites the record: slower, never wrong.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
import queue
import shlex
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from farm.bundle.manifest import (Bundle, BundleFile, cached_digest, check_workspace_name,
                                  file_identity, remember_digest)
from farm.device.probe import parse_df, split_sections
from farm.device.protocol import DeviceLike
from farm.execute import chunkstore
from farm.execute.chunking import Chunk, ChunkPolicy, FileChunks, chunk_file
from farm.execute.chunkstore import ChunkStats, Stored, listing_command, parse_listing, store_dir
from farm.execute.devicecmd import PARTIAL_SUFFIX, discard, groups, parse_sha256sum, parse_stat
from farm.errors import AdbError, InfraError, UsageError

log = logging.getLogger(__name__)

RECORD_NAME = ".ptefarm-deploy.json"
Verify = Literal["fast", "full"]
VERIFY_LEVELS = ("fast", "full")

IN_FLIGHT = 3  # files pushed at once: the small libraries go alongside the big .pte
READ_BLOCK = 1 << 20  # a push that hashes reads its host file in blocks of this size ...
READ_AHEAD = 4  # ... at most this many ahead of the push: 4 MiB per push in flight
PUSH_MTIME_AGE_S = 2  # pushed files are dated this far in the past (see the module docstring)

ProgressCallback = Callable[[str, int], None]  # (file name, bytes just sent); called one at a time


@dataclass
class DeployReport:
    serial: str
    workspace: str
    files_pushed: int = 0
    bytes_pushed: int = 0
    files_skipped: int = 0
    files_hashed: int = 0  # hashed on the device to decide
    seconds: float = 0.0
    pushed: list[str] = field(default_factory=list)
    chunks: dict[str, Any] | None = None  # what the chunked push did (ChunkStats), if files went so

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        chunks = ""
        if self.chunks and self.chunks.get("files"):
            c = self.chunks
            chunks = (f" ({c['files']} as chunks: {c['chunks_pushed']} of {c['chunks']} pushed, "
                      f"{c['bytes_reused']} bytes found on the device"
                      + (f", {c['chunks_repaired']} repaired" if c["chunks_repaired"] else "") + ")")
        elif self.chunks and self.chunks.get("fallback"):
            chunks = f" (pushed whole: {self.chunks['fallback']})"
        return (f"{self.serial}: pushed {self.files_pushed} files ({self.bytes_pushed} bytes){chunks}, "
                f"skipped {self.files_skipped}, hashed {self.files_hashed} on device, "
                f"{self.seconds:.2f} s -> {self.workspace}")


class _Cancelled(Exception):
    """Another push of the same deploy failed (or the deploy was interrupted): stop this one."""


class _Source:
    """A host file as ``device.push`` reads it (with ``readinto``, as DeviceLike.push promises: no
    ``read``, which nothing would call); a read after ``cancel`` is set raises ``_Cancelled``, which
    ends the push (its stream closes, the device drops the partial file).

    With ``hashing``, a thread of its own reads the file ahead of the push, ``READ_AHEAD`` blocks at
    most, and hashes each block as it reads it: the file is read once, the digest is of the bytes the
    push is given, and the hash (hashlib lets go of the GIL) runs while the push thread sends. A host
    read error reaches the push as the ``OSError`` it was. ``close`` stops the reader; it must be
    called before ``raw`` is closed."""

    def __init__(self, raw, cancel: threading.Event, *, hashing: bool):
        self.raw = raw
        self.cancel = cancel
        self.hash = hashlib.sha256() if hashing else None
        self.exhausted = False  # (hashing) the push read to the end of the file: the hash is whole
        self._pending = memoryview(b"")
        self._stop = threading.Event()
        self._blocks: queue.Queue[bytes | BaseException] | None = None
        self._reader: threading.Thread | None = None
        if hashing:
            self._blocks = queue.Queue(READ_AHEAD)

    def _read_ahead(self) -> None:
        try:
            while not self._stop.is_set():
                block = self.raw.read(READ_BLOCK)
                if block:
                    self.hash.update(block)
                self._put(block)
                if not block:
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the push's thread, raised there
            self._put(e)

    def _put(self, item: bytes | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._blocks.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def readinto(self, buf) -> int:
        if self.cancel.is_set():
            raise _Cancelled
        if self._blocks is None:  # a digest from a verify: nothing to hash, nothing to read ahead
            return self.raw.readinto(buf) or 0
        if self.exhausted:
            return 0
        if not self._pending:
            if self._reader is None:  # started by the push's first read, not before: the bytes
                self._reader = threading.Thread(target=self._read_ahead, name="deploy-read",
                                                daemon=True)  # read are those of the push's time
                self._reader.start()
            item = self._blocks.get()
            if isinstance(item, BaseException):
                raise item
            if not item:
                self.exhausted = True
                return 0
            self._pending = memoryview(item)
        n = min(len(buf), len(self._pending))
        buf[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._stop.set()
        if self._reader is not None:
            self._reader.join()


class _Progress:
    """Bytes sent so far by all pushes, and the caller's ``on_progress``, called one at a time
    although the pushes run on several threads (a progress bar need not be thread-safe)."""

    def __init__(self, callback: ProgressCallback | None):
        self.callback = callback
        self.sent = 0
        self._lock = threading.Lock()

    def for_file(self, name: str) -> Callable[[int], None]:
        def on_bytes(n: int) -> None:
            with self._lock:
                self.sent += n
                if self.callback:
                    self.callback(name, n)
        return on_bytes


def _where(bundle: Bundle) -> str:
    """What an error about the bundle names: its manifest, or its name when it has none."""
    return str(bundle.manifest_path or bundle.name)


def bundle_workspace(device: DeviceLike, bundle: Bundle) -> str:
    """``<device workspace>/<bundle name>``; the bundle name must be one plain path component."""
    name = bundle.name
    if not name or "/" in name or name in (".", "..") or "\0" in name or "\n" in name:
        raise UsageError(f"{_where(bundle)}: bundle name {name!r} must be a single file name")
    return posixpath.join(device.workspace, name)


def select_files(bundle: Bundle, device: DeviceLike) -> list[BundleFile]:
    """The bundle's files for this device's HTP arch, re-checked for names that escape the workspace."""
    where = _where(bundle)
    arch = device.htp_arch
    archs = bundle.htp_archs()
    if archs and arch not in archs:
        raise UsageError(f"{where}: bundle has QNN libraries for {', '.join(sorted(archs))} only; "
                         f"device {device.serial} ({device.soc or 'unknown SoC'}) is "
                         f"{arch or 'of unknown HTP arch'}")
    files = bundle.files_for(arch)
    seen: set[str] = set()
    for i, f in enumerate(files):
        name = check_workspace_name(f.name, f"{where}: files[{i}]")
        if name != f.name or PARTIAL_SUFFIX in name or name == RECORD_NAME:
            raise UsageError(f"{where}: file name {f.name!r} is not a plain workspace name")
        if name in seen:
            raise UsageError(f"{where}: two files named {name!r} for HTP arch {arch}")
        seen.add(name)
        try:
            actual = f.path.stat().st_size
        except OSError as e:
            raise UsageError(f"{where}: cannot read {f.path}: {e.strerror}") from None
        if actual != f.size:
            raise UsageError(f"{where}: {f.path} is {actual} bytes, manifest says {f.size}")
    return files




def _load_record(text: str) -> dict[str, dict[str, Any]]:
    try:
        raw = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}  # a corrupt record only costs hashing; it is rewritten below
    files = raw.get("files") if isinstance(raw, dict) else None
    if not isinstance(files, dict):
        return {}
    return {name: entry for name, entry in files.items() if isinstance(entry, dict)}


def deploy(device: DeviceLike, bundle: Bundle, *, verify: Verify = "fast",
           on_progress: ProgressCallback | None = None, on_plan: Callable[[int], None] | None = None,
           timeout: float = 60.0, hash_timeout: float = 1800.0,
           chunking: ChunkPolicy | None = None) -> DeployReport:
    """Make the bundle's workspace on ``device`` hold exactly the manifest's bytes.

    ``chunking`` says which files go as content-defined chunks through the device's chunk store
    (farm.execute.chunkstore; default: ``ChunkPolicy.from_env()``, files of 16 MiB and more).

    ``on_plan(bytes)`` is called once with the bytes about to be pushed, ``on_progress(name, n)`` as
    they go (for a progress bar). ``timeout`` bounds every shell call and every stall of a push;
    ``hash_timeout`` the on-device sha256 of the files in doubt.
    """
    if verify not in VERIFY_LEVELS:
        raise UsageError(f"verify level {verify!r} is not one of {VERIFY_LEVELS}")
    started = time.monotonic()
    policy = chunking if chunking is not None else ChunkPolicy.from_env()
    files = select_files(bundle, device)
    ws = bundle_workspace(device, bundle)
    report = DeployReport(serial=device.serial, workspace=ws)
    qws = shlex.quote(ws)
    stat = shlex.join(["stat", "-c", "%s %Y %n", "--"])

    store = store_dir(device)
    # The chunk store is listed in the same call when a file may go as chunks.
    listing = (f" echo @@chunks; ( {listing_command(store)} );"
               if any(policy.chunks(f.size) for f in files) else "")

    def probe_command(stat_names: str) -> str:
        return (f"mkdir -p {qws} && cd {qws} && "
                f"{{ find . -name {shlex.quote('*' + PARTIAL_SUFFIX + '*')} -type f -exec rm -f {{}} + ; "
                f"echo @@stat; {stat} {stat_names} 2>/dev/null; echo @@record; "
                f"cat {RECORD_NAME} 2>/dev/null; echo; echo @@df; df -k . 2>/dev/null;{listing} true; }}")

    # 1. One call: create the workspace, drop leftovers of interrupted pushes, stat, read the record
    # (and as many more calls as the names to stat need: see COMMAND_BYTES).
    stat_groups = groups([shlex.quote(n) for n in [RECORD_NAME, *(f.name for f in files)]],
                          len(probe_command("")))
    probe = device.shell(probe_command(stat_groups[0]), timeout=timeout)
    if probe.exit_code != 0:
        raise AdbError(f"device {device.serial}: cannot create workspace {ws}: {probe.err.strip()}",
                       serial=device.serial)
    sections = split_sections(probe.out)
    stat_out = [sections.get("stat", "")]
    for group in stat_groups[1:]:  # a missing file is no error: `true` makes the exit code 0
        stat_out.append(device.shell(f"cd {qws} && {{ {stat} {group} 2>/dev/null; true; }}",
                                     timeout=timeout, check=True).out)
    remote = parse_stat("\n".join(stat_out))
    record = _load_record(sections.get("record", ""))
    record_file = remote.pop(RECORD_NAME, None)

    to_push: list[BundleFile] = []
    to_hash: list[BundleFile] = []
    known: dict[str, str] = {}  # name -> sha256 of the bytes the device holds (or will hold)
    for f in files:
        r = remote.get(f.name)
        if r is None or r.size != f.size:
            to_push.append(f)
            continue
        entry = record.get(f.name) or {}
        trusted = (verify == "fast" and record_file is not None and entry.get("size") == r.size
                   and entry.get("mtime") == r.mtime and r.mtime < record_file.mtime
                   and isinstance(entry.get("sha256"), str))
        if trusted:
            if entry.get("sha256") != f.sha256:
                to_push.append(f)  # the record knows the device holds other content
            else:
                known[f.name] = entry["sha256"]
        else:
            to_hash.append(f)

    # 2. One call hashes every file in doubt.
    if to_hash:
        sha = f"cd {qws} && sha256sum --"
        digests = {}
        for group in groups([shlex.quote(f.name) for f in to_hash], len(sha) + 1):
            digests.update(parse_sha256sum(device.shell(f"{sha} {group}", timeout=hash_timeout).out))
        report.files_hashed = len(to_hash)
        for f in to_hash:
            if digests.get(f.name) == f.sha256:
                known[f.name] = f.sha256
            else:
                to_push.append(f)
    pushing = {f.name for f in to_push}
    report.files_skipped = len(files) - len(pushing)

    free = parse_df(sections.get("df", ""))
    chunked = [f for f in to_push if policy.chunks(f.size)]
    stats = ChunkStats()
    stored, strays = parse_listing(sections.get("chunks", "")) if listing else ({}, [])
    plans: dict[str, FileChunks] = {}
    want: dict[str, tuple[FileChunks, Chunk]] = {}
    if chunked:
        t = time.monotonic()
        plans = {f.name: _chunk_plan(bundle, f, policy) for f in chunked}
        stats.seconds_chunking = time.monotonic() - t
        want = chunkstore.missing(plans.values(), stored)
        strays += [stored.pop(sha).path for sha in want if sha in stored]  # held at a wrong size
        chunked = _room_for_chunks(device, store, plans, want, stored, to_push, free, stats,
                                   timeout=timeout)
        if not chunked:
            plans, want = {}, {}
    plain = [f for f in to_push if f.name not in plans]
    if strays:  # copies cut short or shadowed by a whole one: never used, so never kept
        try:
            chunkstore.remove(device, store, strays, timeout=timeout)
        except InfraError as e:
            log.info("device %s: stray chunks not removed (the next deploy will): %s",
                     device.serial, e)
    # Bytes the device is to write (chunks, then files assembled from them), and bytes to send.
    need = sum(f.size for f in to_push) + sum(c.size for _, c in want.values())
    sending = sum(f.size for f in plain) + sum(c.size for _, c in want.values())
    if free is not None and need > free:
        raise AdbError(f"device {device.serial}: {ws} has {free} bytes free, deploy needs {need} "
                       f"bytes", serial=device.serial)
    if on_plan:
        on_plan(sending)

    # 3. Push every changed file under a temporary name, dated a little in the past (see above),
    # then (4.) the new record under a temp name, over sync streams kept between the pushes.
    file_mtime = int(time.time()) - PUSH_MTIME_AGE_S
    mtimes = {f.name: file_mtime for f in plain}
    with sync_streams_kept(device):
        digests = _push_files(device, bundle, ws, plain, need, mtime=file_mtime,
                              timeout=timeout, on_progress=on_progress)
        if plans:
            try:
                assembled = _push_chunked(device, bundle, ws, store, chunked, plans, want, stored,
                                          stats, need, mtime=file_mtime, timeout=timeout,
                                          hash_timeout=hash_timeout, on_progress=on_progress)
            except BaseException:
                discard(device, [posixpath.join(ws, f.name + PARTIAL_SUFFIX) for f in plain], timeout)
                raise
            for name, (digest, mtime) in assembled.items():
                digests[name] = digest
                mtimes[name] = mtime
        for f in files:  # reported in the manifest's order, whatever order the pushes finished in
            if f.name in digests:
                known[f.name] = digests[f.name]
                report.files_pushed += 1
                if f.name not in plans:  # a chunked file's bytes sent are its chunks', below
                    report.bytes_pushed += f.size
                report.pushed.append(f.name)
        report.bytes_pushed += stats.bytes_pushed

        if not to_push and not to_hash and record_file is not None:
            report.seconds = time.monotonic() - started
            return report  # nothing changed, nothing learned: the record stands

        entries = {f.name: {"sha256": known[f.name], "size": f.size,
                            "mtime": mtimes[f.name] if f.name in pushing else remote[f.name].mtime}
                   for f in files if f.name in known}
        for name, entry in entries.items():  # the chunks a deployed file was made of stay listed:
            chunks = (stats.chunk_lists.get(name) if name in pushing  # the next rebuild's delta is
                      else _recorded_chunks(record.get(name), entry["sha256"]))  # taken from them
            if chunks:
                entry["chunks"] = chunks
        body = json.dumps({"bundle": bundle.name, "files": entries}, sort_keys=True).encode()
        device.push(io.BytesIO(body), posixpath.join(ws, RECORD_NAME + PARTIAL_SUFFIX),
                    timeout=timeout)
    # 5. One command puts everything in place (or several in turn: see _finish_commands).
    for command in _finish_commands(ws, files, pushing):
        device.shell(command, timeout=timeout, check=True)
    if listing:
        _bound_store(device, store, stored, want, policy, stats, timeout=timeout)
    if stats.files or stats.fallback or stats.chunks_evicted:
        report.chunks = stats.to_dict()
    report.seconds = time.monotonic() - started
    return report


def _recorded_chunks(entry: dict[str, Any] | None, sha256: str) -> list[str] | None:
    chunks = (entry or {}).get("chunks")
    if (entry or {}).get("sha256") == sha256 and isinstance(chunks, list):
        return [c for c in chunks if isinstance(c, str)]
    return None


def _chunk_plan(bundle: Bundle, f: BundleFile, policy: ChunkPolicy) -> FileChunks:
    """The chunks of ``f``, read once (with the digest of a verify in this process, if there was
    one, the file's sha256 is not taken again); the bundle's error if it is not the manifest's."""
    try:
        st = os.stat(f.path)
        plan = chunk_file(f.path, policy, file_digest=cached_digest(f.path, st))
    except OSError as e:
        raise UsageError(f"{_where(bundle)}: cannot read {f.path}: {e.strerror or e}") from None
    if plan.size != f.size or plan.sha256 != f.sha256:
        raise UsageError(f"{_where(bundle)}: {f.path} changed or is corrupt: it is {plan.size} bytes "
                         f"with sha256 {plan.sha256}, manifest says {f.size} bytes with sha256 "
                         f"{f.sha256}; not deployed")
    return plan


def _room_for_chunks(device: DeviceLike, store: str, plans: dict[str, FileChunks],
                     want: dict[str, tuple[FileChunks, Chunk]], stored: dict[str, Stored],
                     to_push: list[BundleFile], free: int | None, stats: ChunkStats, *,
                     timeout: float) -> list[BundleFile]:
    """The files to push as chunks: all of ``plans``' when the device has room for the missing
    chunks and the assembled files (after evicting chunks no deployed file needs, if it must), none
    (a plain push: ``stats.fallback`` says why) when it has not."""
    chunked = [f for f in to_push if f.name in plans]
    need = sum(f.size for f in to_push) + sum(c.size for _, c in want.values())
    if free is None or need <= free:
        return chunked
    protected = set().union(*(p.unique() for p in plans.values()))
    refs = chunkstore.referenced(device, RECORD_NAME, timeout=timeout)
    if refs is not None:
        store_total = sum(s.size for s in stored.values())
        n, freed = chunkstore.evict(device, store, stored, protected | refs,
                                    store_total - (need - free), timeout=timeout)
        stats.chunks_evicted += n
        stats.bytes_evicted += freed
        free += freed
    if need <= free:
        return chunked
    stats.fallback = (f"{free} bytes free, chunks and assembly need {need}: "
                      f"{len(chunked)} files pushed whole")
    log.info("device %s: %s", device.serial, stats.fallback)
    return []


def _bound_store(device: DeviceLike, store: str, stored: dict[str, Stored],
                 want: dict[str, tuple[FileChunks, Chunk]], policy: ChunkPolicy, stats: ChunkStats, *,
                 timeout: float) -> None:
    """Evict the least recently used chunks beyond ``policy.store_bytes`` that no deploy record on
    the device lists. Best effort: a deploy that got here has succeeded."""
    if sum(s.size for s in stored.values()) <= policy.store_bytes:
        return
    try:
        refs = chunkstore.referenced(device, RECORD_NAME, timeout=timeout)
        if refs is None:
            return
        n, freed = chunkstore.evict(device, store, stored, refs, policy.store_bytes,
                                    timeout=timeout)
    except InfraError as e:
        log.warning("device %s: could not evict chunks beyond the store's bound: %s",
                    device.serial, e)
        return
    stats.chunks_evicted += n
    stats.bytes_evicted += freed


def _push_chunked(device: DeviceLike, bundle: Bundle, ws: str, store: str, files: list[BundleFile],
                  plans: dict[str, FileChunks], want: dict[str, tuple[FileChunks, Chunk]],
                  stored: dict[str, Stored], stats: ChunkStats, need: int, *, mtime: int,
                  timeout: float, hash_timeout: float,
                  on_progress: ProgressCallback | None) -> dict[str, tuple[str, int]]:
    """Push the chunks the store lacks, assemble each file into its partial name and check its
    sha256 on the device (repairing damaged chunks, see farm.execute.chunkstore); name ->
    (sha256 the device computed, mtime on the device). On failure no partial file is left."""
    progress = _Progress(on_progress)
    cancel = threading.Event()
    partials = {f.name: posixpath.join(ws, f.name + PARTIAL_SUFFIX) for f in files}
    push_kw = dict(timeout=timeout, cancel=cancel, cancelled=_Cancelled,
                   on_bytes=lambda name, n: progress.for_file(name)(n))

    def host_unchanged() -> None:
        for f in files:
            if not plans[f.name].unchanged():
                raise UsageError(f"{_where(bundle)}: {f.path} changed while it was pushed; "
                                 f"not deployed")

    repaired: set[str] = set()
    every = {sha: c for p in plans.values() for sha, c in p.unique().items()}  # each chunk once
    stats.files = len(files)
    stats.chunks = len(every)
    try:
        try:
            t = time.monotonic()
            chunkstore.push_chunks(device, store, want, stored, **push_kw)
            stats.chunks_pushed += len(want)
            stats.bytes_pushed += sum(c.size for _, c in want.values())
            host_unchanged()
            stats.seconds_pushing = time.monotonic() - t
            t = time.monotonic()
            assemble = dict(timeout=timeout, hash_timeout=hash_timeout, mtime=mtime)
            # Each file assembled and hashed by a command of its own, IN_FLIGHT at once: a phone
            # has cores to spare, and a bundle's programs are rebuilt together.
            with ThreadPoolExecutor(min(IN_FLIGHT, len(files)),
                                    thread_name_prefix="deploy-assemble") as assemblers:
                jobs = {f.name: assemblers.submit(chunkstore.assemble, device, store, plans[f.name],
                                                  stored, partials[f.name], **assemble)
                        for f in files}
                got = {name: job.result() for name, job in jobs.items()}
            for f in files:
                digest = got[f.name][0]
                if digest == f.sha256:
                    continue
                # The store lied: find the chunks that are not what their names say, push them anew.
                plan = plans[f.name]
                bad = chunkstore.damaged(device, store, plan, stored, timeout=hash_timeout)
                if not bad:
                    raise chunkstore.assembled_wrong(device, f.name, digest, f.sha256)
                log.warning("device %s: %d chunks of %s were damaged in the store; pushing them again",
                            device.serial, len(bad), f.name)
                redo = {sha: (plan, plan.unique()[sha]) for sha in bad}
                chunkstore.push_chunks(device, store, redo, stored, **push_kw)
                stats.chunks_repaired += len(bad)
                repaired |= bad
                stats.bytes_pushed += sum(c.size for _, c in redo.values())
                host_unchanged()
                got[f.name] = chunkstore.assemble(device, store, plan, stored, partials[f.name],
                                                  **assemble)
                if got[f.name][0] != f.sha256:
                    raise chunkstore.assembled_wrong(device, f.name, got[f.name][0], f.sha256)
        except AdbError as e:
            if "space" not in str(e).lower():
                raise
            raise AdbError(f"device {device.serial}: storage full in {ws}: deploy needs {need} "
                           f"bytes (chunks and the files assembled from them) ({e})",
                           serial=device.serial) from None
        except OSError as e:  # the host file, not the device
            raise UsageError(f"{_where(bundle)}: cannot read a chunked file: {e.strerror or e}") \
                from None
    except BaseException:
        cancel.set()
        discard(device, [p + suffix for p in partials.values() for suffix in ("", ".chunks")],
                timeout)
        raise
    stats.seconds_assembling = time.monotonic() - t
    for f in files:
        stats.chunk_lists[f.name] = [c.sha256 for c in plans[f.name].chunks]
    sent = set(want) | repaired
    stats.chunks_reused = len(every.keys() - sent)
    stats.bytes_reused = sum(c.size for sha, c in every.items() if sha not in sent)
    return {f.name: got[f.name] for f in files}


def sync_streams_kept(device: DeviceLike) -> AbstractContextManager[object]:
    """``device.keep_sync()`` where the device offers it (``farm.devices.Device`` does: one sync
    stream carries several pushes, as with ``adb push`` of many files), else nothing."""
    keep = getattr(device, "keep_sync", None)
    return keep() if callable(keep) else nullcontext()


def _finish_commands(ws: str, files: list[BundleFile], pushing: set[str]) -> list[str]:
    """Old record out, pushed files and new record in, runner executable: one ``&&`` chain, so the
    device stops at the first failure with no record vouching for a half-renamed workspace. A chain
    longer than ``COMMAND_BYTES`` is cut into several, run in turn (each one's failure stops the
    deploy): the old record still goes in the first and the new one comes in the last."""
    cd = f"cd {shlex.quote(ws)} && "
    steps = [shlex.join(["rm", "-f", "--", RECORD_NAME])]
    steps += [shlex.join(["mv", "-f", "--", f.name + PARTIAL_SUFFIX, f.name])
              for f in files if f.name in pushing]
    steps += [shlex.join(["chmod", "755", "--", f.name]) for f in files if f.role == "runner"]
    steps.append(shlex.join(["mv", "-f", "--", RECORD_NAME + PARTIAL_SUFFIX, RECORD_NAME]))
    return [cd + chain for chain in groups(steps, len(cd), sep=" && ")]


def _push_files(device: DeviceLike, bundle: Bundle, ws: str, files: list[BundleFile], need: int, *,
                mtime: int, timeout: float, on_progress: ProgressCallback | None) -> dict[str, str]:
    """Push ``files`` to their partial names, biggest first, ``IN_FLIGHT`` at a time; name -> sha256
    of the bytes each push sent. The first failure is raised once the other pushes have stopped."""
    if not files:
        return {}
    progress = _Progress(on_progress)
    cancel = threading.Event()
    pushers = ThreadPoolExecutor(min(IN_FLIGHT, len(files)), thread_name_prefix="deploy-push")
    try:
        jobs: dict[Future[str], BundleFile] = {}
        for f in sorted(files, key=lambda f: f.size, reverse=True):
            jobs[pushers.submit(_push_one, device, bundle, f, ws, need, mtime=mtime, timeout=timeout,
                                progress=progress, cancel=cancel)] = f
        return {jobs[job].name: job.result() for job in as_completed(jobs)}
    except BaseException:
        cancel.set()  # the running pushes stop at their next block ...
        pushers.shutdown(wait=True, cancel_futures=True)
        # ... and the files they finished go too: a failed deploy leaves nothing but what it found.
        discard(device, [posixpath.join(ws, f.name + PARTIAL_SUFFIX) for f in files], timeout)
        raise
    finally:
        pushers.shutdown(wait=True, cancel_futures=True)


def _push_one(device: DeviceLike, bundle: Bundle, f: BundleFile, ws: str, need: int, *, mtime: int,
              timeout: float, progress: _Progress, cancel: threading.Event) -> str:
    """Push one file to its partial name; the sha256 of the bytes sent (see the module docstring).
    A refused file's partial is removed by ``_push_files``, with those of the other pushes."""
    partial = posixpath.join(ws, f.name + PARTIAL_SUFFIX)
    mode = 0o755 if f.role == "runner" else 0o644
    try:
        started = time.time_ns()
        before = os.stat(f.path)
        cached = cached_digest(f.path, before)  # a verify in this process hashed these very bytes
        with open(f.path, "rb") as raw:
            src = _Source(raw, cancel, hashing=cached is None)
            try:
                sent = device.push(src, partial, mode=mode, timeout=timeout,
                                   on_bytes=progress.for_file(f.name), mtime=mtime)
            finally:
                src.close()
        after = os.stat(f.path)
        if file_identity(before) != file_identity(after):  # a build still writing it: not what to deploy
            raise UsageError(f"{_where(bundle)}: {f.path} changed while it was pushed; "
                             f"not deployed")
        if cached is not None:
            digest = cached
        elif not src.exhausted:
            raise UsageError(f"{_where(bundle)}: {f.path}: the push to device {device.serial} "
                             f"ended after {sent} of its {f.size} bytes; not deployed")
        else:
            digest = src.hash.hexdigest()
            if digest == f.sha256:  # the next device's push need not hash it again
                remember_digest(f.path, after, digest, since_ns=started)
    except AdbError as e:
        if "space" not in str(e).lower():
            raise
        raise AdbError(f"device {device.serial}: storage full in {ws}: deploy needs {need} bytes, "
                       f"{max(need - progress.sent, 0)} of them not yet written when pushing "
                       f"{f.name} failed ({e})", serial=device.serial) from None
    except OSError as e:  # the host file, not the device (Device.push maps its own errors)
        raise UsageError(f"{_where(bundle)}: cannot read {f.path}: {e.strerror or e}") from None
    if sent != f.size or digest != f.sha256:
        raise UsageError(f"{_where(bundle)}: {f.path} changed or is corrupt: pushed {sent} bytes "
                         f"with sha256 {digest}, manifest says {f.size} bytes with sha256 "
                         f"{f.sha256}; not deployed")
    return digest
