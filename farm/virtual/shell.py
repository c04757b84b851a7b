"""Shell services of a virtual device: ``shell:`` (v1), ``shell,v2,...:`` and ``exec:``.

Each command is a real host process ``/bin/sh -c CMD`` in its own session (so its whole process group
can be killed when the server closes the stream), with cwd = the device root and PATH starting with
the device's imitation Android tools.
"""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import threading
from dataclasses import dataclass
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
HANG_ARGV = ["/bin/sh", "-c", "while :; do sleep 3600; done"]


class ShellProtocol(Enum):
    V1 = "v1"      # stdout+stderr merged, no exit code
    V2 = "v2"      # framed stdin/stdout/stderr/exit packets
    RAW = "raw"    # exec: raw bytes both ways


@dataclass(frozen=True)
class ShellRequest:
    protocol: ShellProtocol
    command: str


def parse_shell_service(service: str) -> ShellRequest | None:
    """``shell:CMD`` / ``shell,v2,raw,TERM=x:CMD`` / ``exec:CMD``; None when not a shell service or
    the command is empty (an interactive shell is not provided)."""
    if service.startswith("exec:"):
        request = ShellRequest(ShellProtocol.RAW, service[len("exec:"):])
    elif service.startswith(("shell:", "shell,")):
        head, sep, command = service.partition(":")
        if not sep:
            return None
        options = head.split(",")[1:]
        protocol = ShellProtocol.V2 if "v2" in options else ShellProtocol.V1
        request = ShellRequest(protocol, command)
    else:
        return None
    return request if request.command.strip() else None


@dataclass(frozen=True)
class CommandContext:
    root: Path
    env: dict[str, str]
    pgid_dir: Path  # one file per running command's process group, so a killed device's are found


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
    argv = HANG_ARGV if stream.faults.hangs(request.command) else ["/bin/sh", "-c", request.command]
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if v2 else subprocess.STDOUT,
            cwd=ctx.root, env=ctx.env | stream.faults.command_env(), start_new_session=True,
            bufsize=0)
    except OSError as e:
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

    def pump(fd_file, packet_id: int | None) -> None:
        fd = fd_file.fileno()
        try:
            while True:
                data = os.read(fd, _READ_SIZE)
                if not data:
                    break
                if packet_id is not None:
                    data = _V2_HEADER.pack(packet_id, len(data)) + data
                stream.write(data)
        except (StreamClosed, OSError):
            kill_group(proc.pid)
        finally:
            fd_file.close()

    pumps = [threading.Thread(target=pump, args=(proc.stdout, ID_STDOUT if v2 else None),
                              daemon=True)]
    if v2:
        pumps.append(threading.Thread(target=pump, args=(proc.stderr, ID_STDERR), daemon=True))
    stdin_thread = threading.Thread(target=_feed_stdin, args=(stream, proc, v2), daemon=True)
    for t in pumps:
        t.start()
    stdin_thread.start()
    for t in pumps:
        t.join()
    code = proc.wait()
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


def _feed_stdin(stream: Stream, proc: subprocess.Popen, v2: bool) -> None:
    """Server -> command stdin. v2 data is framed; close-stdin closes the pipe."""
    stdin = proc.stdin
    pending = bytearray()
    try:
        while True:
            chunk = stream.read_chunk()
            if chunk is None:
                break
            if not v2:
                if stdin is not None:
                    stdin.write(chunk)
                continue
            pending += chunk
            while len(pending) >= _V2_HEADER.size:
                packet_id, length = _V2_HEADER.unpack_from(pending)
                if len(pending) < _V2_HEADER.size + length:
                    break
                data = bytes(pending[_V2_HEADER.size:_V2_HEADER.size + length])
                del pending[:_V2_HEADER.size + length]
                if packet_id == ID_STDIN and stdin is not None:
                    stdin.write(data)
                elif packet_id == ID_CLOSE_STDIN and stdin is not None:
                    stdin.close()
                    stdin = None
    except (OSError, ValueError) as e:
        log.warning("stdin of command %d dropped: it closed its stdin or exited (%s)", proc.pid, e)
    finally:
        if stdin is not None:
            try:
                stdin.close()
            except OSError as e:
                log.warning("closing stdin of command %d: %s", proc.pid, e)


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
