"""What deploy, run and compare need from a device: ``DeviceLike``.

``farm.devices.Device`` (a phone or a virtual device behind an adb server) is one; a test can hand in
anything else of this shape (``tests/support/fake_device.py`` runs the commands with ``sh -c`` in a
temporary directory), so that deploy planning and output parsing are tested without adb. In labgrid's
terms this is the protocol, ``Device`` the driver and the adb server the resource.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO, Protocol, runtime_checkable

if TYPE_CHECKING:
    from farm.device.transport import ShellResult


@runtime_checkable
class DeviceLike(Protocol):
    """A device the farm can deploy to and run on.

    Errors follow farm.errors: a vanished device is ``DeviceGone``, a command past its ``timeout``
    ``DeviceTimeout`` (the command is ended), any other failure of the device ``AdbError``.
    """

    @property
    def serial(self) -> str: ...

    @property
    def workspace(self) -> str:
        """The absolute device directory the farm owns; bundles go into ``<workspace>/<name>``."""
        ...

    @property
    def soc(self) -> str | None: ...

    @property
    def htp_arch(self) -> str | None:
        """``"v75"``; decides which per-arch QNN libraries of a bundle the device receives."""
        ...

    def shell(self, command: str, *, timeout: float, check: bool = False) -> ShellResult:
        """``sh -c command`` on the device: exit code, stdout and stderr apart. ``check``: a non-zero
        exit is ``AdbError``."""
        ...

    def push(self, src: BinaryIO, remote: str, *, mode: int = 0o644, timeout: float = 60.0,
             on_bytes: Callable[[int], None] | None = None, mtime: int | None = None) -> int:
        """Write ``src`` (read with ``readinto``) to the device path ``remote``, creating its parents,
        with ``mode`` and ``mtime`` (default: now); the bytes written. ``timeout`` bounds a stall."""
        ...

    def read_file(self, remote: str, *, timeout: float = 60.0) -> bytes:
        """A (small) device file's content; a missing file is ``AdbError``."""
        ...
