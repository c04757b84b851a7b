"""``FakeDevice``: a ``farm.device.protocol.DeviceLike`` without adb, for unit tests of deploy and run.

Its workspace is a temporary directory on the host; shell commands run there with ``sh -c`` (host
coreutils stand in for toybox: ``stat -c``, ``sha256sum``, ``df -k`` and ``find`` agree on what the farm
reads), pushes and reads are plain file I/O. Every call is recorded (``commands``, ``pushes``,
``reads``) so a test can assert what a deploy pushed, skipped and hashed.

Confinement: the farm's commands only name the workspace (absolute paths below it, relative paths
after ``cd`` into it). Each command is checked before it runs: an absolute path outside the directory
(other than ``/dev/null`` and ``/proc/...``, which the farm only reads) or a ``..`` component fails the
test instead of running, as does a push or read outside it. ``HOME`` and ``TMPDIR`` point inside it.
``programs`` are extra executables (name -> script) put first on the command's ``PATH``, e.g. a
``df`` that reports a full disk or a host ``farm-llama-runner`` stand-in.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from farm.device.transport import ShellResult
from farm.errors import AdbError, DeviceTimeout
from farm.soc import htp_arch as htp_arch_of

READ_ONLY_OUTSIDE = ("/dev/null", "/proc/")
CHUNK = 64 * 1024


class FakeDevice:
    def __init__(self, root: Path, *, serial: str = "fake-1", soc: str | None = "SM8650",
                 programs: dict[str, str] | None = None):
        self.root = Path(root).resolve()
        self.serial = serial
        self.soc = soc
        self.commands: list[str] = []
        self.pushes: list[str] = []
        self.reads: list[str] = []
        self._bin = self.root / ".fake-bin"
        self._tmp = self.root / ".fake-tmp"
        for d in (self.root, self._bin, self._tmp):
            d.mkdir(parents=True, exist_ok=True)
        for name, text in (programs or {}).items():
            self.add_program(name, text)

    def __repr__(self) -> str:
        return f"FakeDevice({self.serial!r} in {self.root})"

    @property
    def workspace(self) -> str:
        return str(self.root)

    @property
    def htp_arch(self) -> str | None:
        return htp_arch_of(self.soc)

    def add_program(self, name: str, text: str) -> None:
        path = self._bin / name
        path.write_text(text)
        path.chmod(0o755)

    # -- confinement ------------------------------------------------------------------------------

    def _inside(self, path: str) -> Path:
        resolved = Path(os.path.normpath(path if os.path.isabs(path) else self.root / path))
        if not resolved.is_relative_to(self.root):
            raise AssertionError(f"{self}: {path!r} is outside the device directory")
        return resolved

    def check_command(self, command: str) -> None:
        """Fail (AssertionError) on a command that names a path outside the directory."""
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        for token in lexer:
            if ".." in token.split("/"):
                raise AssertionError(f"{self}: '..' in command token {token!r}: {command!r}")
            if token.startswith("/") and not token.startswith(READ_ONLY_OUTSIDE):
                self._inside(token)

    # -- DeviceLike ---------------------------------------------------------------------------------

    def shell(self, command: str, *, timeout: float, check: bool = False) -> ShellResult:
        self.check_command(command)
        self.commands.append(command)
        env = {"PATH": f"{self._bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(self.root),
               "TMPDIR": str(self._tmp), "LANG": "C.UTF-8"}
        proc = subprocess.Popen(["sh", "-c", command], cwd=self.root, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # as adbd hangs up on a closed stream's command
            proc.communicate()
            raise DeviceTimeout(f"device {self.serial}: command did not finish in {timeout:g} s: "
                                f"{command[:120]}", serial=self.serial) from None
        result = ShellResult(command, proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise AdbError(f"device {self.serial}: {command[:120]!r} exited {proc.returncode}: "
                           f"{result.err.strip() or result.out.strip()}", serial=self.serial)
        return result

    def push(self, src: BinaryIO, remote: str, *, mode: int = 0o644, timeout: float = 60.0,
             on_bytes: Callable[[int], None] | None = None, mtime: int | None = None) -> int:
        path = self._inside(remote)
        self.pushes.append(remote)
        path.parent.mkdir(parents=True, exist_ok=True)
        total = 0
        buf = bytearray(CHUNK)
        with open(path, "wb") as out:
            while n := src.readinto(buf):
                out.write(memoryview(buf)[:n])
                total += n
                if on_bytes:
                    on_bytes(n)
        path.chmod(mode)
        stamp = int(time.time()) if mtime is None else mtime
        os.utime(path, (stamp, stamp))
        return total

    def read_file(self, remote: str, *, timeout: float = 60.0) -> bytes:
        path = self._inside(remote)
        self.reads.append(remote)
        try:
            return path.read_bytes()
        except OSError as e:
            raise AdbError(f"device {self.serial}: cannot read {remote}: {e.strerror}",
                           serial=self.serial) from None

    # -- for assertions -----------------------------------------------------------------------------

    def hashed(self) -> list[str]:
        """The file names the device was asked to sha256, in order."""
        names: list[str] = []
        for command in self.commands:
            for part in command.split(" && "):
                if part.startswith("sha256sum -- "):
                    names += shlex.split(part)[2:]
        return names
