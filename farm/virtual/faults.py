"""Faults a virtual device injects, switchable while it runs.

They live in ``<root>/faults.json``, written atomically by :func:`write_faults`; the device re-reads the
file on every stream open and sync request, so a test flips a fault without restarting anything.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from farm.errors import UsageError
from farm.fileio import write_atomic

FAULTS_FILE = "faults.json"
RUNNER_DELAY_ENV = "PTEFARM_RUNNER_DELAY_MS"


@dataclass(frozen=True)
class Faults:
    drop_after_bytes: int | None = None       # close the TCP connection after N payload bytes on a stream
    slow_bytes_per_s: int | None = None       # the device's link at this rate: all streams, both ways
    disk_full_after_bytes: int | None = None  # SEND fails "No space left on device" past N bytes
    hang_commands: str | None = None          # regex: a matching shell command never finishes
    runner_delay_ms: int | None = None        # the host runner sleeps this long per decoded token
    boot_completed_delay_ms: int | None = None  # at (re)boot, sys.boot_completed is set this much later
    # every shell command hangs (a wedged phone: adbd up, nothing runs) until the next boot, which
    # clears it: what only the recovery ladder's reboot rung can cure
    hang_until_reboot: bool | None = None

    def __post_init__(self) -> None:
        for name in ("drop_after_bytes", "slow_bytes_per_s", "disk_full_after_bytes", "runner_delay_ms",
                     "boot_completed_delay_ms"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise UsageError(f"fault '{name}' must be a non-negative integer, got {value!r}")
        if self.hang_until_reboot is not None and not isinstance(self.hang_until_reboot, bool):
            raise UsageError(f"fault 'hang_until_reboot' must be true or false, got "
                             f"{self.hang_until_reboot!r}")
        if self.slow_bytes_per_s == 0:
            raise UsageError("fault 'slow_bytes_per_s' must be positive, got 0")
        if self.hang_commands is not None:
            try:
                re.compile(self.hang_commands)
            except (re.error, TypeError) as e:
                raise UsageError(f"fault 'hang_commands' is not a valid regex: {e}") from None

    def hangs(self, command: str) -> bool:
        if self.hang_until_reboot:
            return True
        return self.hang_commands is not None and re.search(self.hang_commands, command) is not None

    def command_env(self) -> dict[str, str]:
        """What the device adds to its commands' environment: the host runner reads its throttle here
        (a slowed phone, for the regression gate's tests)."""
        return {} if self.runner_delay_ms is None else {RUNNER_DELAY_ENV: str(self.runner_delay_ms)}

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


NO_FAULTS = Faults()


def read_faults(root: Path) -> Faults:
    """The faults in force for the device rooted at ``root``; none when the file is absent."""
    try:
        raw = json.loads((root / FAULTS_FILE).read_text())
    except FileNotFoundError:
        return NO_FAULTS
    except (OSError, ValueError) as e:
        raise UsageError(f"{root / FAULTS_FILE}: unreadable fault file: {e}") from None
    known = {f.name for f in fields(Faults)}
    unknown = set(raw) - known
    if unknown:
        raise UsageError(f"{root / FAULTS_FILE}: unknown fault(s) {sorted(unknown)} "
                         f"(known: {sorted(known)})")
    return Faults(**raw)


def clear_at_boot(root: Path) -> bool:
    """A (re)boot ends the faults that last until one; True if one was in force."""
    faults = read_faults(root)
    if not faults.hang_until_reboot:
        return False
    write_faults(root, replace(faults, hang_until_reboot=None))
    return True


def write_faults(root: Path, faults: Faults) -> None:
    """Replace the device's faults atomically (a reader never sees a half-written file)."""
    if not faults.any:
        (root / FAULTS_FILE).unlink(missing_ok=True)
        return
    data = {k: v for k, v in asdict(faults).items() if v is not None}
    write_atomic(root / FAULTS_FILE, json.dumps(data))
