"""Fencing: a holder whose lease ended never acts on the device again, even if it does not know yet.

A lease's own clock (``Lease.check``) stops a holder that notices; a holder that was stopped between its
check and its command (SIGSTOP, a long GC pause, a frozen VM) would still send that command when it
resumes. So the device keeps a fence: the token of the lease that holds it, written to
``<workspace>/.ptefarm-fence`` when the lease begins (``claim``). Every shell command of a
``FencedDevice`` first compares the fence with its own token on the device and refuses to run if another
lease has claimed the device since: the fencing token of distributed locks, kept by the device itself.
Pushes write only to temporary names (deploy renames them with a fenced shell command).
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any, BinaryIO

from farm.errors import AdbError, LeaseLost

FENCE_NAME = ".ptefarm-fence"
FENCED_EXIT = 75  # EX_TEMPFAIL; with the marker on stderr, it cannot be mistaken for a runner's exit
FENCED_MARK = "ptefarm: fenced:"


class FencedDevice:
    """A device (farm.device.protocol.DeviceLike) that acts only while ``lease`` holds it."""

    def __init__(self, device: Any, lease: Any):
        self.device = device
        self.lease = lease

    @property
    def fence_path(self) -> str:
        return posixpath.join(self.device.workspace, FENCE_NAME)

    def claim(self, timeout: float = 30.0) -> None:
        """Write our token to the device's fence: from now on only this lease's commands run."""
        self.lease.check()
        fence = shlex.quote(self.fence_path)
        self.device.shell(f"mkdir -p {shlex.quote(self.device.workspace)} && "
                          f"printf %s {shlex.quote(self.lease.token)} > {fence}.tmp && "
                          f"mv -f {fence}.tmp {fence}", timeout=timeout, check=True)

    def holds(self, timeout: float = 30.0) -> bool:
        """Whether the device's fence names our lease already (then a claim would change nothing)."""
        fence = self.device.shell(f"cat {shlex.quote(self.fence_path)} 2>/dev/null", timeout=timeout)
        return fence.out.strip() == self.lease.token

    def guard(self, command: str) -> str:
        token = shlex.quote(self.lease.token)
        return (f'[ "$(cat {shlex.quote(self.fence_path)} 2>/dev/null)" = {token} ] || '
                f'{{ echo "{FENCED_MARK} lease {self.lease.token[:8]} no longer holds this device" >&2; '
                f"exit {FENCED_EXIT}; }}; {command}")

    def shell(self, command: str, *, timeout: float, check: bool = False):
        self.lease.check()
        result = self.device.shell(self.guard(command), timeout=timeout, check=False)
        if result.exit_code == FENCED_EXIT and FENCED_MARK in result.err:
            raise LeaseLost(f"device {self.device.serial} is held by another lease now: "
                            f"{result.err.strip()}", serial=self.device.serial)
        if check and result.exit_code != 0:
            raise AdbError(f"device {self.device.serial}: {command[:120]!r} exited {result.exit_code}: "
                           f"{(result.err.strip() or result.out.strip())[:200]}",
                           serial=self.device.serial)
        return result

    def push(self, src: BinaryIO, remote: str, **kwargs: Any) -> int:
        self.lease.check()
        return self.device.push(src, remote, **kwargs)

    def read_file(self, remote: str, **kwargs: Any) -> bytes:
        self.lease.check()
        return self.device.read_file(remote, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)  # serial, workspace, soc, htp_arch, info(), ...

