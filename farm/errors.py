"""The farm's exception types.

Two families are kept apart everywhere, from here to the JUnit report:
- ``InfraError``: the infrastructure failed (device gone, adb error, timeout, pool unavailable).
  Reported as a JUnit ``<error>``, retried on another device, never counted against the model.
- ``UsageError``: the input is bad (a file, a flag, a config key). Its message names what is wrong.
A test *failure* (tokens differ, throughput under threshold) is a plain assertion, not a FarmError.
"""

from __future__ import annotations


class FarmError(Exception):
    """Base of every error the farm raises on purpose. ``str(e)`` is a one-line message."""


class UsageError(FarmError):
    """Bad input: a missing or corrupt file, an invalid flag, config key or manifest field."""


class InfraError(FarmError):
    """The infrastructure failed; the code under test is not to blame."""

    def __init__(self, message: str, *, serial: str | None = None):
        super().__init__(message)
        self.serial = serial


class AdbError(InfraError):
    """The adb server or a device transport reported an error."""


class DeviceGone(InfraError):
    """The device vanished (unplugged, killed, offline) during an operation."""


class DeviceTimeout(InfraError):
    """A command on the device did not finish in time; it was killed."""


class PoolError(InfraError):
    """The device pool (its database) cannot be reached or refused an operation."""


class LeaseTimeout(InfraError):
    """No device matching a request became available in time."""


class LeaseError(UsageError):
    """A lease operation with a stale or foreign token."""


class RunIncomplete(InfraError):
    """The runner exited 0 but left no usable output (no or empty outputs.txt, no generated tokens):
    an error of the run, never a pass. Carries the exit code, what is missing and the stderr tail."""

    def __init__(self, message: str, *, serial: str | None = None, exit_code: int | None = None,
                 missing: str = "", stderr_tail: str = "", result: object = None):
        super().__init__(message, serial=serial)
        self.exit_code, self.missing, self.stderr_tail, self.result = \
            exit_code, missing, stderr_tail, result


class LeaseLost(InfraError):
    """Our lease on a device ended (expired while we stalled, or taken away): we must not touch the
    device again, and nothing measured since can be trusted."""


class AdbServerDown(AdbError):
    """The adb server itself cannot be reached (nothing listens on its port, it refused or dropped
    the connection before answering): the server's fault, not its devices'. The message names the
    server's host:port."""

    def __init__(self, message: str, *, serial: str | None = None, server: str | None = None):
        super().__init__(message, serial=serial)
        self.server = server
