"""Value types of the pool: what a request asks for, who holds a lease, what a device looks like.

These are plain dataclasses with no database in them, so that the matching rules (which device satisfies
which request) are one function, used by the leasing code and by tests that replay the event log.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from farm.errors import UsageError
from farm.vocab import DeviceState

if TYPE_CHECKING:  # the pool reads a DeviceInfo's attributes; it does not need adb to be importable
    from farm.device.probe import DeviceInfo

# Device states (see farm.vocab.DeviceState), under the names the pool code has always used.
AVAILABLE = DeviceState.AVAILABLE
LEASED = DeviceState.LEASED
QUARANTINED = DeviceState.QUARANTINED
OFFLINE = DeviceState.OFFLINE
STATES: tuple[DeviceState, ...] = tuple(DeviceState)

# Named priorities: release qualification goes before nightly runs, which go before PR gates.
PRIORITIES: dict[str, int] = {"release": 100, "nightly": 50, "pr": 10, "adhoc": 0}


def parse_priority(value: str | int) -> int:
    """``"release"`` or ``"100"`` or ``100`` -> 100; anything else is a UsageError naming the value."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in PRIORITIES:
        return PRIORITIES[text]
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"priority {value!r}: expected an integer or one of "
                         f"{', '.join(PRIORITIES)}") from None


def htp_arch_number(value: str | int | None, *, what: str = "htp_arch") -> int | None:
    """``"v75"``, ``"V75"``, ``"75"`` and ``75`` are all HTP arch 75; None stays unknown."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = re.fullmatch(r"[vV]?(\d+)", str(value).strip())
    if not m:
        raise UsageError(f"{what}: {value!r} is not an HTP arch such as 'v75'")
    return int(m.group(1))


@dataclass(frozen=True)
class DeviceRecord:
    """A device as the pool stores it: identity and attributes from discovery, plus pool state."""

    serial: str
    server: str  # "host:port" of the adb server the device is attached to
    soc: str | None = None
    htp_arch: str | None = None
    model: str | None = None
    virtual: bool = False
    tags: tuple[str, ...] = ()
    state: str = AVAILABLE
    reason: str = ""
    present: bool = True
    infra_failures: int = 0
    last_seen: float | None = None  # pool clock: the last sync that found it, or success on it

    @classmethod
    def from_info(cls, info: DeviceInfo) -> DeviceRecord:
        """The pool's identity and attributes of a device discovery found (its pool state is the
        pool's to set); a field the pool cannot use is a UsageError naming the device."""
        if not info.serial or not isinstance(info.serial, str):
            raise UsageError(f"device record {info!r}: field 'serial' must be a non-empty string")
        if not info.server:
            raise UsageError(f"device {info.serial}: field 'server' is missing")
        htp_arch_number(info.htp_arch, what=f"device {info.serial}: field 'htp_arch'")  # validates
        if isinstance(info.tags, str) or not all(isinstance(t, str) for t in info.tags):
            raise UsageError(f"device {info.serial}: field 'tags' must be a list of strings")
        return cls(serial=info.serial, server=str(info.server), soc=info.soc or None,
                   htp_arch=info.htp_arch or None, model=info.model or None,
                   virtual=bool(info.virtual), tags=tuple(sorted(set(info.tags))))

    @property
    def htp_arch_num(self) -> int | None:
        try:
            return htp_arch_number(self.htp_arch)
        except UsageError:
            return None

    def describe(self) -> str:
        bits = [self.soc or "unknown SoC"]
        if self.htp_arch:
            bits.append(f"HTP {self.htp_arch}")
        if self.virtual:
            bits.append("virtual")
        if self.tags:
            bits.append("tags " + ",".join(self.tags))
        return f"{self.serial} ({', '.join(bits)}) on {self.server}"


@dataclass(frozen=True)
class LeaseRequest:
    """What a holder asks for. Empty fields mean "any". ``priority``: higher is served first."""

    socs: tuple[str, ...] = ()
    min_htp_arch: int | None = None
    tags: tuple[str, ...] = ()
    serial: str | None = None
    virtual: bool | None = None
    priority: int = 0
    exclude: tuple[str, ...] = ()  # serials not to grant (e.g. the device an attempt just failed on)

    def __post_init__(self) -> None:
        # Accept lists and "v75" from callers, store one canonical form (it is also the queue's JSON).
        object.__setattr__(self, "socs", tuple(sorted({s.strip().upper() for s in self.socs})))
        object.__setattr__(self, "tags", tuple(sorted(set(self.tags))))
        object.__setattr__(self, "exclude", tuple(sorted(set(self.exclude))))
        object.__setattr__(self, "min_htp_arch",
                           htp_arch_number(self.min_htp_arch, what="request min_htp_arch"))
        object.__setattr__(self, "priority", parse_priority(self.priority))

    def matches(self, device: DeviceRecord) -> bool:
        """Whether ``device``'s attributes satisfy this request (its state is not considered)."""
        if self.serial is not None and device.serial != self.serial:
            return False
        if device.serial in self.exclude:
            return False
        if self.socs and (device.soc or "").upper() not in self.socs:
            return False
        if self.min_htp_arch is not None:
            arch = device.htp_arch_num
            if arch is None or arch < self.min_htp_arch:
                return False
        if self.virtual is not None and device.virtual != self.virtual:
            return False
        return set(self.tags) <= set(device.tags)

    def describe(self) -> str:
        parts = []
        if self.serial:
            parts.append(f"serial {self.serial}")
        if self.socs:
            parts.append("SoC " + "|".join(self.socs))
        if self.min_htp_arch is not None:
            parts.append(f"HTP >= v{self.min_htp_arch}")
        if self.tags:
            parts.append("tags " + ",".join(self.tags))
        if self.virtual is not None:
            parts.append("virtual" if self.virtual else "physical")
        if self.exclude:
            parts.append("not " + ",".join(self.exclude))
        return (" and ".join(parts) or "any device") + f" (priority {self.priority})"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LeaseRequest:
        raw = json.loads(text)
        raw["socs"] = tuple(raw.get("socs", ()))
        raw["tags"] = tuple(raw.get("tags", ()))
        raw["exclude"] = tuple(raw.get("exclude", ()))
        return cls(**raw)


def _ci_job_from_env() -> str:
    """The CI job id under the common CI systems, so a stuck lease can be traced to its job."""
    env = os.environ
    for key in ("PTEFARM_CI_JOB", "CI_JOB_ID", "BUILD_TAG", "BUILDKITE_JOB_ID"):
        if env.get(key):
            return env[key]
    if env.get("GITHUB_RUN_ID"):
        return f"{env.get('GITHUB_REPOSITORY', '')}#{env['GITHUB_RUN_ID']}/{env.get('GITHUB_JOB', '')}"
    return ""


@dataclass(frozen=True)
class Holder:
    """Who holds (or waits for) a lease: enough to find the process or the CI job."""

    user: str
    host: str
    pid: int
    ci_job: str = ""
    purpose: str = ""

    @classmethod
    def current(cls, purpose: str = "") -> Holder:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = str(os.getuid())
        return cls(user=user, host=socket.gethostname(), pid=os.getpid(), ci_job=_ci_job_from_env(),
                   purpose=purpose)

    def describe(self) -> str:
        text = f"{self.user}@{self.host} pid {self.pid}"
        if self.ci_job:
            text += f" job {self.ci_job}"
        if self.purpose:
            text += f" ({self.purpose})"
        return text


@dataclass(frozen=True)
class LeaseInfo:
    """A lease row: the token, the device, the holder, and its clock (database time, epoch seconds)."""

    token: str
    serial: str
    holder: Holder
    priority: int
    created: float
    renewed: float
    expires: float
    ended: float | None = None
    end_reason: str | None = None


@dataclass(frozen=True)
class QueueEntry:
    """A waiting request. Waiters are served by (priority desc, id asc); id is arrival order."""

    id: int
    request: LeaseRequest
    holder: Holder
    ttl: float
    enqueued: float
    polled: float

    @property
    def rank(self) -> tuple[int, int]:
        """Service order: smaller is served first."""
        return (-self.request.priority, self.id)

    def ranks_before(self, priority: int, queue_id: int) -> bool:
        return self.rank < (-priority, queue_id)


@dataclass(frozen=True)
class Event:
    """One line of the event log. ``id`` orders events in commit order (writes are serialized)."""

    id: int
    at: float
    kind: str
    serial: str | None
    from_state: str | None
    to_state: str | None
    token: str | None
    queue_id: int | None
    holder: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DeviceStatus:
    device: DeviceRecord
    lease: LeaseInfo | None


@dataclass(frozen=True)
class PoolStatus:
    now: float
    devices: list[DeviceStatus] = field(default_factory=list)
    queue: list[QueueEntry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        def lease_dict(lease: LeaseInfo | None) -> dict[str, Any] | None:
            if lease is None:
                return None
            d = asdict(lease)
            d["expires_in_s"] = round(lease.expires - self.now, 3)
            return d

        return {
            "now": self.now,
            "devices": [{**asdict(d.device), "tags": list(d.device.tags), "lease": lease_dict(d.lease)}
                        for d in self.devices],
            "queue": [{"id": q.id, "request": asdict(q.request), "holder": asdict(q.holder),
                       "enqueued": q.enqueued, "waiting_s": round(self.now - q.enqueued, 3)}
                      for q in self.queue],
        }


@dataclass(frozen=True)
class SyncReport:
    """What ``Pool.sync`` changed; serial lists."""

    added: list[str] = field(default_factory=list)
    returned: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
