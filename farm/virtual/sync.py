"""The ``sync:`` service of a virtual device (SYNC.TXT), confined to the device's root directory.

Device paths are host paths (the device reports its workspace as a host path), but only paths inside
the root are served: anything else gets FAIL "permission denied", so a push can never write outside it.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from farm.virtual.faults import Faults
from farm.virtual.stream import Stream, StreamClosed, StreamReader

log = logging.getLogger(__name__)

MAX_PATH = 1024
SYNC_DATA_MAX = 64 * 1024
_REQ = struct.Struct("<4sI")
_STAT_V1 = struct.Struct("<4sIII")
# id, error, dev, ino, mode, nlink, uid, gid, size, atime, mtime, ctime
_STAT_V2 = struct.Struct("<4sIQQIIIIQqqq")
_DENT = struct.Struct("<4sIIII")


class SyncFail(Exception):
    """A request that gets a FAIL reply with this message."""


class SyncService:
    def __init__(self, stream: Stream, root: Path, load_faults: Callable[[], Faults],
                 free_bytes: int | None = None):
        self.stream = stream
        self.reader = StreamReader(stream)
        self.root = Path(os.path.realpath(root))
        self.load_faults = load_faults
        self.free_bytes = free_bytes
        self._out = bytearray()

    # --- output: batched into WRTEs no larger than maxdata -------------------------------------
    def _emit(self, data: bytes | memoryview) -> None:
        self._out += data
        if len(self._out) >= self.stream.transport.max_payload - SYNC_DATA_MAX - 8:
            self._flush()

    def _flush(self) -> None:
        if self._out:
            out, self._out = self._out, bytearray()
            self.stream.write(out)

    def _fail(self, message: str) -> None:
        data = message.encode()
        self._emit(b"FAIL" + struct.pack("<I", len(data)) + data)

    # --- path confinement ----------------------------------------------------------------------
    def _confine(self, device_path: str) -> Path:
        if not device_path.startswith("/"):
            raise SyncFail(f"{device_path}: permission denied (not an absolute path)")
        real = os.path.realpath(device_path)
        if real != str(self.root) and not real.startswith(str(self.root) + os.sep):
            raise SyncFail(f"{device_path}: permission denied")
        return Path(real)

    # --- main loop ---------------------------------------------------------------------------
    def serve(self) -> None:
        try:
            while True:
                ident, length = _REQ.unpack(self.reader.read_exact(_REQ.size))
                if ident == b"QUIT":
                    break
                if length > MAX_PATH:
                    self._fail(f"path too long ({length} > {MAX_PATH})")
                    break
                path = self.reader.read_exact(length).decode("utf-8", "surrogateescape")
                handler = self._HANDLERS.get(ident)
                if handler is None:
                    self._fail(f"unknown sync request {ident!r}")
                    break
                handler(self, path)
                self._flush()
        except StreamClosed:
            log.debug("sync session ended by the server")  # how a client ends it without QUIT
        finally:
            try:
                self._flush()
            except StreamClosed as e:
                log.warning("sync replies not sent: %s", e)
            self.stream.close()

    def _lookup_stat(self, path: str, follow: bool) -> os.stat_result | int:
        """The stat of a confined path, or an errno."""
        try:
            p = self._confine(path)
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
            directory = self._confine(path)
            with os.scandir(directory) as it:
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
            src = self._confine(path)
            f = open(src, "rb")  # noqa: SIM115 - closed by the with below, after the checks
        except SyncFail as e:
            self._fail(str(e))
            return
        except OSError as e:
            self._fail(f"{path}: {e.strerror}")
            return
        self.stream.faults = self.load_faults()
        self._flush()
        # DATA chunks are read straight into one maxdata-sized WRTE buffer: no per-chunk copies.
        buf = bytearray(self.stream.transport.max_payload)
        view = memoryview(buf)
        pos = 0
        with f:
            while True:
                if pos + 8 + SYNC_DATA_MAX > len(buf):
                    self.stream.write(view[:pos])
                    pos = 0
                n = f.readinto(view[pos + 8:pos + 8 + SYNC_DATA_MAX])
                if not n:
                    break
                struct.pack_into("<4sI", buf, pos, b"DATA", n)
                pos += 8 + n
        if pos:
            self.stream.write(view[:pos])
        self._emit(b"DONE" + struct.pack("<I", 0))

    def _send(self, spec: str) -> None:
        path, _, mode_text = spec.rpartition(",")
        if not path:
            path, mode_text = spec, "0"
        faults = self.load_faults()
        self.stream.faults = faults
        limit = min((n for n in (faults.disk_full_after_bytes, self.free_bytes) if n is not None),
                    default=None)
        error: str | None = None
        tmp_fd, tmp_path, final = -1, None, None
        try:
            mode = int(mode_text or "0")
            final = self._confine(path)
            final.parent.mkdir(parents=True, exist_ok=True)  # fixed_push_mkdir
            tmp_path = final.parent / f".{final.name}.ptefarm-partial-{os.getpid()}"
            tmp_fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except SyncFail as e:
            error = str(e)
        except ValueError:
            error = f"{spec}: bad mode {mode_text!r}"
        except OSError as e:
            error = f"{path}: {e.strerror}"
        written = 0
        mtime = 0

        def sink(piece: memoryview) -> None:
            nonlocal error
            if error is None:
                try:
                    _write_all(tmp_fd, piece)
                except OSError as e:  # a real full disk, say
                    error = f"{path}: {e.strerror}"
        try:
            # Read DATA until DONE even after an error: the client only looks at the reply then.
            while True:
                ident, length = _REQ.unpack(self.reader.read_exact(_REQ.size))
                if ident == b"DONE":
                    mtime = length
                    break
                if ident != b"DATA" or length > SYNC_DATA_MAX:
                    error = error or f"bad sync packet {ident!r} of length {length}"
                    raise StreamClosed(error)  # the byte stream is out of step: give up
                if error is None and limit is not None and written + length > limit:
                    error = f"{path}: No space left on device"
                self.reader.copy_to(length, sink)
                written += length
            if error is None:
                os.fchmod(tmp_fd, stat.S_IMODE(mode) or 0o644)
                os.close(tmp_fd)
                tmp_fd = -1
                os.utime(tmp_path, (mtime, mtime))
                os.replace(tmp_path, final)
                tmp_path = None
                self._emit(b"OKAY" + struct.pack("<I", 0))
            else:
                self._fail(error)
        finally:
            # Also on a dropped connection: never leave the partial file behind.
            if tmp_fd >= 0:
                os.close(tmp_fd)
            if tmp_path is not None:
                try:
                    os.unlink(tmp_path)
                except OSError as e:
                    log.warning("cannot remove the partial file %s: %s", tmp_path, e)

    _HANDLERS: ClassVar[dict[bytes, Callable[[SyncService, str], None]]] = {
        b"STAT": _stat_v1,
        b"STA2": _sta2,
        b"LST2": _lst2,
        b"LIST": _list,
        b"LIS2": _lis2,
        b"RECV": _recv,
        b"SEND": _send,
    }


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]
