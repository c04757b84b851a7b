"""Cached, content-addressed deployment of a bundle to a device workspace.

Upstream (SimpleADB) wipes the workspace and pushes every file on every run: a 1.3 GB .pte each time.
Here the device keeps a record (``.ptefarm-deploy.json`` in the bundle's workspace) of what it holds:
``{name: {sha256, size, mtime}}``. A deploy asks the device for the size and mtime of every file in one
shell call and decides per file:

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
device). The record is removed before the renames, so a deploy stopped half-way leaves no record that
vouches for a file it replaced.

The record holds only digests the deploy knows for the bytes on the device: for a pushed file the
sha256 of the bytes actually streamed (hashed while pushing; a host file whose bytes differ from the
manifest's digest is refused, ``UsageError`` naming it and both digests, and is not recorded), for a
kept file the digest the device's ``sha256sum`` reported or the previous record's.
The record is written the same way (push to a temp name, ``mv``). Pushed files get an mtime two seconds
in the past (the sync protocol lets the pusher choose it), the record the present: the record is then
strictly newer than every file, and any later edit on the device moves a file's mtime away from the
recorded one. Should a device ignore the pushed mtime, its files look "racily clean" to the next
deploy, which hashes them once and rewrites the record: slower, never wrong.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import posixpath
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from farm.bundle import Bundle, BundleFile, check_workspace_name
from farm.device_probe import parse_df, split_sections
from farm.device_protocol import DeviceLike
from farm.errors import AdbError, InfraError, UsageError

log = logging.getLogger(__name__)

RECORD_NAME = ".ptefarm-deploy.json"
PARTIAL_SUFFIX = ".ptefarm-partial"
Verify = Literal["fast", "full"]
VERIFY_LEVELS = ("fast", "full")

ProgressCallback = Callable[[str, int], None]  # (file name, bytes just sent)


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (f"{self.serial}: pushed {self.files_pushed} files ({self.bytes_pushed} bytes), "
                f"skipped {self.files_skipped}, hashed {self.files_hashed} on device, "
                f"{self.seconds:.2f} s -> {self.workspace}")


class _HashingReader:
    """A binary file whose bytes are hashed as ``device.push`` reads them."""

    def __init__(self, raw):
        self.raw = raw
        self.hash = hashlib.sha256()

    def readinto(self, buf) -> int:
        n = self.raw.readinto(buf)
        if n:
            self.hash.update(memoryview(buf)[:n])
        return n or 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.hash.update(data)
        return data


@dataclass(frozen=True)
class _Remote:
    size: int
    mtime: int


def bundle_workspace(device: DeviceLike, bundle: Bundle) -> str:
    """``<device workspace>/<bundle name>``; the bundle name must be one plain path component."""
    name = bundle.name
    if not name or "/" in name or name in (".", "..") or "\0" in name or "\n" in name:
        raise UsageError(f"{bundle.manifest_path}: bundle name {name!r} must be a single file name")
    return posixpath.join(device.workspace, name)


def select_files(bundle: Bundle, device: DeviceLike) -> list[BundleFile]:
    """The bundle's files for this device's HTP arch, re-checked for names that escape the workspace."""
    where = str(bundle.manifest_path or bundle.name)
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


def _where(bundle: Bundle) -> str:
    return str(bundle.manifest_path or bundle.name)


def _discard(device: DeviceLike, remote: str, timeout: float) -> None:
    """Remove a pushed temp file, best effort (the next deploy removes leftovers anyway)."""
    try:
        device.shell(shlex.join(["rm", "-f", "--", remote]), timeout=timeout)
    except InfraError as e:
        log.warning("device %s: could not remove %s (the next deploy will): %s", device.serial, remote, e)


def _parse_stat(text: str) -> dict[str, _Remote]:
    found: dict[str, _Remote] = {}
    for line in text.split("\n"):
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[1].lstrip("-").isdigit():
            found[parts[2]] = _Remote(int(parts[0]), int(parts[1]))
    return found


def _parse_sha256sum(text: str) -> dict[str, str]:
    digests: dict[str, str] = {}
    for line in text.split("\n"):
        escaped = line.startswith("\\")  # coreutils escapes names containing \ or newline
        if escaped:
            line = line[1:]
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            continue
        if escaped:
            name = name.replace("\\n", "\n").replace("\\\\", "\\")
        digests[name] = digest.lower()
    return digests


def _load_record(text: str) -> dict[str, dict[str, Any]]:
    try:
        raw = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}  # a corrupt record only costs hashing; it is rewritten below
    files = raw.get("files") if isinstance(raw, dict) else None
    return files if isinstance(files, dict) else {}


def deploy(device: DeviceLike, bundle: Bundle, *, verify: Verify = "fast",
           on_progress: ProgressCallback | None = None, on_plan: Callable[[int], None] | None = None,
           timeout: float = 60.0, hash_timeout: float = 1800.0) -> DeployReport:
    """Make the bundle's workspace on ``device`` hold exactly the manifest's bytes.

    ``on_plan(bytes)`` is called once with the bytes about to be pushed, ``on_progress(name, n)`` as
    they go (for a progress bar). ``timeout`` bounds every shell call and every stall of a push;
    ``hash_timeout`` the on-device sha256 of the files in doubt.
    """
    if verify not in VERIFY_LEVELS:
        raise UsageError(f"verify level {verify!r} is not one of {VERIFY_LEVELS}")
    started = time.monotonic()
    files = select_files(bundle, device)
    ws = bundle_workspace(device, bundle)
    report = DeployReport(serial=device.serial, workspace=ws)
    names = [f.name for f in files]
    qws = shlex.quote(ws)
    stat_args = shlex.join(["stat", "-c", "%s %Y %n", "--", RECORD_NAME, *names])

    # 1. One call: create the workspace, drop leftovers of interrupted pushes, stat, read the record.
    probe = device.shell(
        f"mkdir -p {qws} && cd {qws} && "
        f"{{ find . -name {shlex.quote('*' + PARTIAL_SUFFIX + '*')} -type f -exec rm -f {{}} + ; "
        f"echo @@stat; {stat_args} 2>/dev/null; echo @@record; cat {RECORD_NAME} 2>/dev/null; "
        f"echo; echo @@df; df -k . 2>/dev/null; true; }}", timeout=timeout)
    if probe.exit_code != 0:
        raise AdbError(f"device {device.serial}: cannot create workspace {ws}: {probe.err.strip()}",
                       serial=device.serial)
    sections = split_sections(probe.out)
    remote = _parse_stat(sections.get("stat", ""))
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
        sha_args = shlex.join(["sha256sum", "--", *(f.name for f in to_hash)])
        hashed = device.shell(f"cd {qws} && {sha_args}", timeout=hash_timeout)
        digests = _parse_sha256sum(hashed.out)
        report.files_hashed = len(to_hash)
        for f in to_hash:
            if digests.get(f.name) == f.sha256:
                known[f.name] = f.sha256
            else:
                to_push.append(f)
    pushing = {f.name for f in to_push}
    report.files_skipped = len(files) - len(pushing)

    need = sum(f.size for f in to_push)
    free = parse_df(sections.get("df", ""))
    if free is not None and need > free:
        raise AdbError(f"device {device.serial}: {ws} has {free} bytes free, deploy needs {need} "
                       f"bytes", serial=device.serial)
    if on_plan:
        on_plan(need)

    # 3. Push every changed file under a temporary name, dated a little in the past (see above).
    file_mtime = int(time.time()) - 2
    left = need
    for f in files:
        if f.name not in pushing:
            continue
        mode = 0o755 if f.role == "runner" else 0o644
        progress = (lambda n, _name=f.name: on_progress(_name, n)) if on_progress else None
        partial = posixpath.join(ws, f.name + PARTIAL_SUFFIX)
        try:
            with open(f.path, "rb") as raw:
                src = _HashingReader(raw)
                sent = device.push(src, partial, mode=mode, timeout=timeout, on_bytes=progress,
                                   mtime=file_mtime)
        except AdbError as e:
            if "space" not in str(e).lower():
                raise
            raise AdbError(f"device {device.serial}: storage full in {ws}: deploy needs {need} bytes, "
                           f"{left} of them not yet written when pushing {f.name} failed ({e})",
                           serial=device.serial) from None
        except OSError as e:  # the host file, not the device (Device.push maps its own errors)
            raise UsageError(f"{_where(bundle)}: cannot read {f.path}: {e.strerror or e}") from None
        pushed_digest = src.hash.hexdigest()
        if sent != f.size or pushed_digest != f.sha256:
            _discard(device, partial, timeout)
            raise UsageError(f"{_where(bundle)}: {f.path} changed or is corrupt: pushed {sent} bytes "
                             f"with sha256 {pushed_digest}, manifest says {f.size} bytes with sha256 "
                             f"{f.sha256}; not deployed")
        known[f.name] = pushed_digest
        left -= sent
        report.files_pushed += 1
        report.bytes_pushed += sent
        report.pushed.append(f.name)

    if not to_push and not to_hash and record_file is not None:
        report.seconds = time.monotonic() - started
        return report  # nothing changed, nothing learned: the record stands

    # 4. Rename into place, make the runner executable, and stat again for the record.
    # The old record goes first: should the renames stop half-way, no record vouches for a file.
    commands = [f"cd {qws}", shlex.join(["rm", "-f", "--", RECORD_NAME])]
    commands += [shlex.join(["mv", "-f", "--", f.name + PARTIAL_SUFFIX, f.name])
                 for f in files if f.name in pushing]
    commands += [shlex.join(["chmod", "755", "--", f.name]) for f in files if f.role == "runner"]
    commands += ["echo @@stat", shlex.join(["stat", "-c", "%s %Y %n", "--", *names])]
    finish = device.shell(" && ".join(commands), timeout=timeout, check=True)
    remote = _parse_stat(split_sections(finish.out).get("stat", ""))

    # 5. The record, atomically.
    entries = {f.name: {"sha256": known[f.name], "size": f.size, "mtime": remote[f.name].mtime}
               for f in files if f.name in remote and f.name in known
               and remote[f.name].size == f.size}
    body = json.dumps({"bundle": bundle.name, "files": entries}, sort_keys=True).encode()
    device.push(io.BytesIO(body), posixpath.join(ws, RECORD_NAME + PARTIAL_SUFFIX), timeout=timeout)
    device.shell(f"cd {qws} && " + shlex.join(["mv", "-f", "--", RECORD_NAME + PARTIAL_SUFFIX,
                                               RECORD_NAME]), timeout=timeout, check=True)
    report.seconds = time.monotonic() - started
    return report
