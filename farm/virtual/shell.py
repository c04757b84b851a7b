"""Shell services of a virtual device: ``shell:`` (v1), ``shell,v2,...:`` and ``exec:``.

Each command is ``/system/bin/sh -c CMD`` entered into the device's Android view (farm.virtual.confine:
cwd ``/``, uid 2000) or, unconfined, ``/bin/sh -c CMD`` on the host in the device root. Its host process
runs in a session of its own, so its whole process group can be killed when the server closes the
stream. A pty is allocated as adbd does: when asked (``pty``) or for an interactive shell (no command),
unless ``raw`` is asked.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pty
import struct
import subprocess
import termios
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from farm.procs import kill_group
from farm.virtual.stream import Stream, StreamClosed

log = logging.getLogger(__name__)

# shell v2 packet ids
ID_STDIN, ID_STDOUT, ID_STDERR, ID_EXIT, ID_CLOSE_STDIN, ID_WINDOW_SIZE = range(6)
_V2_HEADER = struct.Struct("<BI")
_READ_SIZE = 256 * 1024

# What a command runs instead of itself under the hang_commands fault: never ends until killed.
HANG_COMMAND = "while :; do sleep 3600; done"


class ShellProtocol(Enum):
    V1 = "v1"      # stdout+stderr merged, no exit code
    V2 = "v2"      # framed stdin/stdout/stderr/exit packets
    RAW = "raw"    # exec: raw bytes both ways


@dataclass(frozen=True)
class ShellRequest:
    protocol: ShellProtocol
    command: str           # empty: an interactive shell (pty only)
    pty: bool = False
    term: str | None = None


def parse_shell_service(service: str) -> ShellRequest | None:
    """``shell:CMD`` / ``shell,v2,raw,TERM=x:CMD`` / ``shell,v2,pty:CMD`` / ``exec:CMD``; None when
    not a shell service. A pty when ``pty`` is asked (``adb shell -t``, an interactive ``adb shell``),
    none otherwise (``raw``, or nothing: adbd's default for a command). An empty command without a pty
    (a shell reading commands from stdin) is not provided: None too."""
    if service.startswith("exec:"):
        request = ShellRequest(ShellProtocol.RAW, service[len("exec:"):])
    elif service.startswith(("shell:", "shell,")):
        head, sep, command = service.partition(":")
        if not sep:
            return None
        options = head.split(",")[1:]
        # adbd gives an empty command a pty by default; we do only when asked (`adb shell` from a
        # terminal asks): a client that opens `shell,v2:` with nothing to run gets a refusal.
        use_pty = False
        term = None
        for option in options:
            if option == "raw":
                use_pty = False
            elif option == "pty":
                use_pty = True
            elif option.startswith("TERM="):
                term = option[len("TERM="):]
        protocol = ShellProtocol.V2 if "v2" in options else ShellProtocol.V1
        request = ShellRequest(protocol, command, pty=use_pty, term=term)
    else:
        return None
    return request if request.command.strip() or request.pty else None


def _identity(argv: list[str]) -> list[str]:
    return argv


@dataclass(frozen=True)
class CommandContext:
    """How a device runs a command: ``enter`` turns an argv into the argv that runs it inside the
    device (nsenter into its view; unchanged when unconfined), with ``shell`` the device's sh."""

    cwd: Path        # host cwd of the spawned process (the device root)
    env: dict[str, str]
    pgid_dir: Path   # one file per running command's process group, so a killed device's are found
    shell: str = "/system/bin/sh"
    enter: Callable[[list[str]], list[str]] = field(default=_identity)

    def argv(self, command: str, *, pty: bool = False) -> list[str]:
        """``sh -c command``, or an interactive ``sh`` for an empty command. With a pty: in a new
        session of its own *inside* the device (``setsid -c``), whose controlling terminal the pty
        is, so a shell has job control there (a session made on the host is not visible inside)."""
        argv = [self.shell, "-c", command] if command.strip() else [self.shell, "-"]
        return self.enter(["/usr/bin/setsid", "--wait", "--ctty", *argv] if pty else argv)


def kill_commands(pgid_dir: Path) -> None:
    """Kill every command still recorded in ``pgid_dir`` (a device that stops or was killed -9: its
    commands run in sessions of their own and would outlive it) and forget them."""
    if not pgid_dir.is_dir():
        return
    for entry in pgid_dir.iterdir():
        if entry.name.isdigit():
            kill_group(int(entry.name))
        entry.unlink(missing_ok=True)


def run_shell(stream: Stream, request: ShellRequest, ctx: CommandContext) -> None:
    v2 = request.protocol is ShellProtocol.V2
    command = HANG_COMMAND if stream.faults.hangs(request.command) else request.command
    env = ctx.env | stream.faults.command_env()
    if request.pty:
        env["TERM"] = request.term or "dumb"  # adbd's default for a pty
    master = -1
    try:
        if request.pty:
            master, slave = pty.openpty()
            try:
                proc = subprocess.Popen(ctx.argv(command, pty=True), stdin=slave, stdout=slave,
                                        stderr=slave, cwd=ctx.cwd, env=env, start_new_session=True)
            finally:
                os.close(slave)
        else:
            proc = subprocess.Popen(
                ctx.argv(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE if v2 else subprocess.STDOUT, cwd=ctx.cwd, env=env,
                start_new_session=True, bufsize=0)
    except OSError as e:
        if master >= 0:
            os.close(master)
        _report_spawn_error(stream, v2, str(e))
        return
    pgid_file = ctx.pgid_dir / str(proc.pid)
    try:
        pgid_file.touch()
    except OSError as e:
        log.warning("cannot record command %d in %s (%s): a device killed -9 leaves it running",
                    proc.pid, ctx.pgid_dir, e)
        pgid_file = None
    # The server closing the stream (client timeout, client gone, transport dropped) kills the group.
    stream.add_close_callback(lambda: kill_group(proc.pid))

    def pump(fd: int, packet_id: int | None) -> None:
        try:
            while True:
                try:
                    data = os.read(fd, _READ_SIZE)
                except OSError:  # EIO on a pty master once every writer of the slave is gone
                    break
                if not data:
                    break
                if packet_id is not None:
                    data = _V2_HEADER.pack(packet_id, len(data)) + data
                stream.write(data)
        except StreamClosed:
            kill_group(proc.pid)

    if request.pty:
        sources = [(master, ID_STDOUT if v2 else None)]
        sink: _CommandInput = _PtyInput(master)
    else:
        assert proc.stdout is not None
        sources = [(proc.stdout.fileno(), ID_STDOUT if v2 else None)]
        if v2:
            assert proc.stderr is not None
            sources.append((proc.stderr.fileno(), ID_STDERR))
        sink = _PipeInput(proc)
    pumps = [threading.Thread(target=pump, args=src, daemon=True) for src in sources]
    stdin_thread = threading.Thread(target=_feed_stdin, args=(stream, sink, v2), daemon=True)
    for t in pumps:
        t.start()
    stdin_thread.start()
    for t in pumps:
        t.join()
    code = proc.wait()
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()
    if pgid_file is not None:
        pgid_file.unlink(missing_ok=True)
    if code < 0:
        code = 128 + (-code)  # killed by a signal: what a shell reports
    try:
        if v2:
            stream.write(_V2_HEADER.pack(ID_EXIT, 1) + bytes([code & 0xFF]))
    except StreamClosed:
        log.warning("exit code %d of %r not sent: the stream was closed", code, request.command[:80])
    stream.close()  # also wakes the stdin feeder
    stdin_thread.join(timeout=5)
    sink.close()


class _CommandInput:
    """Where stdin data of a command goes: a pipe, or the pty master."""

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def close_stdin(self) -> None:
        raise NotImplementedError

    def resize(self, spec: bytes) -> None:
        """A window-size packet: only a pty cares."""

    def close(self) -> None:
        self.close_stdin()


class _PipeInput(_CommandInput):
    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.stdin = proc.stdin

    def write(self, data: bytes) -> None:
        if self.stdin is not None:
            self.stdin.write(data)

    def close_stdin(self) -> None:
        stdin, self.stdin = self.stdin, None
        if stdin is not None:
            try:
                stdin.close()
            except OSError as e:
                log.warning("closing stdin of command %d: %s", self.proc.pid, e)


class _PtyInput(_CommandInput):
    def __init__(self, master: int):
        self.master = master
        self._closed = False
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.master, view):]

    def close_stdin(self) -> None:
        """A pty has no stdin of its own to close (adbd ignores close-stdin there too)."""

    def resize(self, spec: bytes) -> None:
        """``ROWSxCOLS,XPIXxYPIX``, as the adb client sends it."""
        try:
            chars, _, pixels = spec.decode().partition(",")
            rows, cols = (int(v) for v in chars.split("x"))
            xpix, ypix = (int(v) for v in pixels.split("x")) if pixels else (0, 0)
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, xpix, ypix))
        except (ValueError, OSError) as e:
            log.warning("bad window size %r: %s", spec, e)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.master)


def _feed_stdin(stream: Stream, sink: _CommandInput, v2: bool) -> None:
    """Server -> command stdin. v2 data is framed; close-stdin closes the pipe."""
    pending = bytearray()
    try:
        while True:
            chunk = stream.read_chunk()
            if chunk is None:
                break
            if not v2:
                sink.write(bytes(chunk))
                continue
            pending += chunk
            while len(pending) >= _V2_HEADER.size:
                packet_id, length = _V2_HEADER.unpack_from(pending)
                if len(pending) < _V2_HEADER.size + length:
                    break
                data = bytes(pending[_V2_HEADER.size:_V2_HEADER.size + length])
                del pending[:_V2_HEADER.size + length]
                if packet_id == ID_STDIN:
                    sink.write(data)
                elif packet_id == ID_CLOSE_STDIN:
                    sink.close_stdin()
                elif packet_id == ID_WINDOW_SIZE:
                    sink.resize(data)
    except (OSError, ValueError) as e:
        log.warning("stdin of a command dropped: it closed its stdin or exited (%s)", e)
    finally:
        sink.close_stdin()


def _report_spawn_error(stream: Stream, v2: bool, message: str) -> None:
    data = f"/bin/sh: {message}\n".encode()
    try:
        if v2:
            stream.write(_V2_HEADER.pack(ID_STDERR, len(data)) + data
                         + _V2_HEADER.pack(ID_EXIT, 1) + bytes([127]))
        else:
            stream.write(data)
    except StreamClosed:
        log.warning("spawn error not reported (%s): the stream was closed", message)
    stream.close()
