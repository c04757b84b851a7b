"""The ``sync:`` service of a virtual device (SYNC.TXT).

The protocol is served by a worker process, ``python -m farm.virtual.syncd``, that a confined device
starts *inside* its Android view (farm.virtual.confine) for each sync session, with the session's
byte stream on its stdin and stdout, as adbd's sync service works on a socket. Push and pull then
resolve ``/data/local/tmp/x`` in the same mount namespace as the shell: no path rewriting, and a
symlink inside the device cannot lead out of it. An unconfined device (degraded mode) runs the same
worker on the host with ``--confine ROOT``: only real paths inside the root are served.

:class:`SyncService` (the worker's protocol handler) imports nothing but the standard library, so a
worker starts in a few milliseconds; farm.virtual.syncpump (the device side) pumps the ADB stream to
and from the worker.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import struct
from pathlib import Path

# Annotations only name BinaryIO, Callable and ClassVar (postponed, never evaluated): importing typing
# would add ~20 ms to every push and pull, the worker's start-up being on their path.

log = logging.getLogger(__name__)

MAX_PATH = 1024
SYNC_DATA_MAX = 64 * 1024
IO_BUFFER = 1 << 20  # large buffered reads/writes both ways: pushes run at hundreds of MB/s
_REQ = struct.Struct("<4sI")
_STAT_V1 = struct.Struct("<4sIII")
# id, error, dev, ino, mode, nlink, uid, gid, size, atime, mtime, ctime
_STAT_V2 = struct.Struct("<4sIQQIIIIQqqq")
_DENT = struct.Struct("<4sIIII")


class SyncFail(Exception):
    """A request that gets a FAIL reply with this message."""


class SyncEOF(Exception):
    """The session's input ended (the server closed the stream, or the connection dropped)."""


class SyncService:
    """One sync session over a byte stream: ``inp`` (requests, DATA) and ``out`` (replies).

    ``confine_root``: serve only real paths inside it (an unconfined device, whose paths are host
    paths); None inside a view, where the mount namespace is the confinement. ``limit_bytes``: the
    largest file a SEND may write (free space or the disk_full_after_bytes fault)."""

    def __init__(self, inp: BinaryIO, out: BinaryIO, *, confine_root: Path | None = None,
                 limit_bytes: int | None = None):
        self.inp = inp
        self.out = out
        self.root = Path(os.path.realpath(confine_root)) if confine_root is not None else None
        self.limit_bytes = limit_bytes
        self._chunk = bytearray(SYNC_DATA_MAX + 8)

    # --- byte stream -------------------------------------------------------------------------------
    def _read_exact(self, n: int) -> bytes:
        data = self.inp.read(n)
        if data is None or len(data) != n:
            raise SyncEOF(f"input ended mid-request ({len(data or b'')} of {n} bytes)")
        return data

    def _read_into(self, n: int) -> memoryview:
        view = memoryview(self._chunk)[:n]
        got = self.inp.readinto(view)
        if got != n:
            raise SyncEOF(f"input ended mid-DATA ({got} of {n} bytes)")
        return view

    def _emit(self, data: bytes | memoryview) -> None:
        self.out.write(data)

    def _fail(self, message: str) -> None:
        data = message.encode("utf-8", "surrogateescape")
        self._emit(b"FAIL" + struct.pack("<I", len(data)) + data)

    # --- paths -------------------------------------------------------------------------------------
    def _path(self, device_path: str) -> Path:
        if not device_path.startswith("/"):
            raise SyncFail(f"{device_path}: permission denied (not an absolute path)")
        if self.root is None:
            return Path(device_path)  # inside the view: the kernel confines
        real = os.path.realpath(device_path)
        if real != str(self.root) and not real.startswith(str(self.root) + os.sep):
            raise SyncFail(f"{device_path}: permission denied")
        return Path(real)

    # --- main loop ---------------------------------------------------------------------------------
    def serve(self) -> None:
        try:
            while True:
                ident, length = _REQ.unpack(self._read_exact(_REQ.size))
                if ident == b"QUIT":
                    break
                if length > MAX_PATH:
                    self._fail(f"path too long ({length} > {MAX_PATH})")
                    break
                path = self._read_exact(length).decode("utf-8", "surrogateescape")
                handler = self._HANDLERS.get(ident)
                if handler is None:
                    self._fail(f"unknown sync request {ident!r}")
                    break
                handler(self, path)
                self.out.flush()
        except SyncEOF as e:
            log.debug("sync session ended: %s", e)  # how a client ends it without QUIT
        finally:
            try:
                self.out.flush()
            except OSError as e:
                log.warning("sync replies not sent: %s", e)

    def _lookup_stat(self, path: str, follow: bool) -> os.stat_result | int:
        """The stat of a path, or an errno."""
        try:
            p = self._path(path)
        except SyncFail:
            return errno.EACCES
        try:
            return os.stat(p) if follow else os.lstat(p)
        except OSError as e:
            return e.errno or errno.EIO

    def _stat_v1(self, path: str) -> None:
        st = self._lookup_stat(path, follow=False)
        if isinstance(st, int):
            self._emit(_STAT_V1.pack(b"STAT", 0, 0, 0))
        else:
            self._emit(_STAT_V1.pack(b"STAT", st.st_mode, st.st_size & 0xFFFFFFFF,
                                     int(st.st_mtime) & 0xFFFFFFFF))

    @staticmethod
    def _pack_v2(ident: bytes, st: os.stat_result | int) -> bytes:
        if isinstance(st, int):
            return _STAT_V2.pack(ident, st, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        return _STAT_V2.pack(ident, 0, st.st_dev, st.st_ino, st.st_mode, st.st_nlink, st.st_uid,
                             st.st_gid, st.st_size, int(st.st_atime), int(st.st_mtime),
                             int(st.st_ctime))

    def _sta2(self, path: str) -> None:
        self._emit(self._pack_v2(b"STA2", self._lookup_stat(path, follow=True)))

    def _lst2(self, path: str) -> None:
        self._emit(self._pack_v2(b"LST2", self._lookup_stat(path, follow=False)))

    def _entries(self, path: str):
        try:
            with os.scandir(self._path(path)) as it:
                for entry in it:
                    try:
                        yield entry.name.encode("utf-8", "surrogateescape"), entry.stat(
                            follow_symlinks=False)
                    except OSError as e:  # removed while listed
                        log.warning("list %s: skipping %s: %s", path, entry.name, e)
        except (SyncFail, OSError) as e:
            log.warning("list %s: %s; answering an empty listing as adbd does", path, e)

    def _list(self, path: str) -> None:
        for name, st in self._entries(path):
            self._emit(_DENT.pack(b"DENT", st.st_mode, st.st_size & 0xFFFFFFFF,
                                  int(st.st_mtime) & 0xFFFFFFFF, len(name)) + name)
        self._emit(_DENT.pack(b"DONE", 0, 0, 0, 0))

    def _lis2(self, path: str) -> None:
        for name, st in self._entries(path):
            self._emit(self._pack_v2(b"DNT2", st) + struct.pack("<I", len(name)) + name)
        self._emit(self._pack_v2(b"DONE", 0) + struct.pack("<I", 0))

    def _recv(self, path: str) -> None:
        try:
            f = open(self._path(path), "rb", buffering=0)  # noqa: SIM115 - closed by the with below
        except SyncFail as e:
            self._fail(str(e))
            return
        except OSError as e:
            self._fail(f"{path}: {e.strerror}")
            return
        # Each DATA chunk is read straight behind its header: one copy, into the output buffer.
        buf = self._chunk
        view = memoryview(buf)
        with f:
            while True:
                try:
                    n = f.readinto(view[8:8 + SYNC_DATA_MAX])
                except OSError as e:  # a directory, say: adbd answers FAIL
                    self._fail(f"{path}: {e.strerror}")
                    return
                if not n:
                    break
                struct.pack_into("<4sI", buf, 0, b"DATA", n)
                self._emit(view[:8 + n])
        self._emit(b"DONE" + struct.pack("<I", 0))

    def _send(self, spec: str) -> None:
        path, _, mode_text = spec.rpartition(",")
        if not path:
            path, mode_text = spec, "0"
        limit = self.limit_bytes
        error: str | None = None
        tmp_fd, tmp_path, final = -1, None, None
        try:
            mode = int(mode_text or "0")
            final = self._path(path)
            final.parent.mkdir(parents=True, exist_ok=True)  # fixed_push_mkdir
            partial = final.parent / f".{final.name}.ptefarm-partial-{os.getpid()}"
            tmp_fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            tmp_path = partial  # only once it exists: a refused create leaves nothing to remove
        except SyncFail as e:
            error = str(e)
        except ValueError:
            error = f"{spec}: bad mode {mode_text!r}"
        except OSError as e:
            error = f"{path}: {e.strerror}"
        written = 0
        mtime = 0
        try:
            # Read DATA until DONE even after an error: the client only looks at the reply then.
            while True:
                ident, length = _REQ.unpack(self._read_exact(_REQ.size))
                if ident == b"DONE":
                    mtime = length
                    break
                if ident != b"DATA" or length > SYNC_DATA_MAX:
                    raise SyncEOF(f"bad sync packet {ident!r} of length {length}: out of step")
                if error is None and limit is not None and written + length > limit:
                    error = f"{path}: No space left on device"
                piece = self._read_into(length)
                written += length
                if error is None:
                    try:
                        _write_all(tmp_fd, piece)
                    except OSError as e:  # a real full disk, say
                        error = f"{path}: {e.strerror}"
            if error is None:
                os.fchmod(tmp_fd, stat.S_IMODE(mode) or 0o644)
                os.close(tmp_fd)
                tmp_fd = -1
                os.utime(tmp_path, (mtime, mtime))
                os.replace(tmp_path, final)
                tmp_path = None
                self._emit(b"OKAY" + struct.pack("<I", 0))
            else:
                # Before the reply: a client told FAIL finds no partial file of ours left.
                _discard_partial(tmp_fd, tmp_path)
                tmp_fd, tmp_path = -1, None
                self._fail(error)
        finally:
            # Also on a dropped connection: never leave the partial file behind.
            _discard_partial(tmp_fd, tmp_path)

    _HANDLERS: ClassVar[dict[bytes, Callable[[SyncService, str], None]]] = {
        b"STAT": _stat_v1,
        b"STA2": _sta2,
        b"LST2": _lst2,
        b"LIST": _list,
        b"LIS2": _lis2,
        b"RECV": _recv,
        b"SEND": _send,
    }


def _discard_partial(fd: int, path: Path | None) -> None:
    if fd >= 0:
        os.close(fd)
    if path is not None:
        try:
            os.unlink(path)
        except OSError as e:
            log.warning("cannot remove the partial file %s: %s", path, e)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]
