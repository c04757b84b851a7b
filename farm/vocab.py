"""The farm's vocabulary: every name that crosses a module boundary, in one place.

Each is a ``StrEnum``, so a member *is* its string (``Updater.SMART_MASK == "SmartMask"``): it goes into
command lines, JSON, TOML and database rows unchanged, and a plain string read back from any of them
compares equal to the member.

- ``Updater``: the KV-cache updaters of qnn_llama_runner (``--kv_updater``).
- ``Dialect``: the runner builds a bundle can name (farm.execute.runprofile turns them into command lines), and
  the updaters each can run (``Dialect.updaters``).
- ``EvalMode``: the bundle mode names and upstream's ``--eval_mode`` numbers, one table both ways.
- ``DeviceState``: a device's state in the pool.
- ``EventKind``: what the pool's event log records (``farm pool history``), and the few of them a run's
  report lists as infrastructure events (``EventKind.infra_name``).
- ``Outcome``: a test's outcome in the farm's reports; ``ErrorKind``: why an ``error`` is one.
- ``Verdict``: a whole run (farm.exitcodes maps it to the exit code).
- ``Purpose``: why a run was made (``--purpose``, kept with its results).
"""

from __future__ import annotations

from enum import StrEnum


class Updater(StrEnum):
    SMART_MASK = "SmartMask"
    SHIFT_POINTER = "ShiftPointer"


class Dialect(StrEnum):
    HOST = "host"  # farm-llama-runner: v1.0.1's flags plus --token_ids_path and --seed
    QNN_V1_0 = "qnn-v1.0"  # qnn_llama_runner v0.7 .. v1.0.1: --kv_updater SmartMask|ShiftPointer
    QNN_V1_4 = "qnn-v1.4"  # v1.1.0 on, as v1.4.1 is: SmartMask only, --shared_buffer, v1.4.1's templates

    @property
    def updaters(self) -> tuple[Updater, ...]:
        """The updaters this runner build can run: ShiftPointer was removed after v1.0.1."""
        if self is Dialect.QNN_V1_4:
            return (Updater.SMART_MASK,)
        return tuple(Updater)

    @property
    def templates(self) -> str:
        """The upstream release whose chat templates a runner of this dialect applies
        (farm.model.template.TEMPLATES): v1.4.1's for qnn-v1.4, v1.0.1's for the others."""
        return "v1.4.1" if self is Dialect.QNN_V1_4 else "v1.0.1"


class EvalMode(StrEnum):
    """A bundle mode name; ``.number`` is the runner's ``--eval_mode``."""

    KV = "kv"
    HYBRID = "hybrid"
    LOOKAHEAD = "lookahead"

    @property
    def number(self) -> int:
        return EVAL_MODE_NUMBERS[self]

    @classmethod
    def from_number(cls, number: int) -> EvalMode | None:
        """The mode of an ``--eval_mode`` number; None for a number upstream does not define."""
        return _EVAL_MODE_BY_NUMBER.get(number)


# The one table: upstream's --eval_mode values (0 = kv, 1 = hybrid, 2 = lookahead).
EVAL_MODE_NUMBERS: dict[EvalMode, int] = {EvalMode.KV: 0, EvalMode.HYBRID: 1, EvalMode.LOOKAHEAD: 2}
_EVAL_MODE_BY_NUMBER: dict[int, EvalMode] = {n: m for m, n in EVAL_MODE_NUMBERS.items()}


class Timing(StrEnum):
    """Where a device's figures come from. Only ``measured`` figures are measurements: ``host-cpu``
    ones are a virtual device's host CPU, ``simulated`` ones a virtual device's phone model
    (farm/runner/timing.py); reports, JUnit and the v3 export say which, for every figure."""

    MEASURED = "measured"
    HOST_CPU = "host-cpu"
    SIMULATED = "simulated"

    @property
    def figures(self) -> str:
        """Where such figures come from, as reports and the CLI say it."""
        return {"measured": "measured (phone)", "host-cpu": "host CPU (virtual device)",
                "simulated": "SIMULATED (phone model, not measured)"}[self.value]

    @property
    def short(self) -> str:
        """Its label beside a figure in a table cell, a plot or a log line."""
        return {"measured": "measured", "host-cpu": "host CPU", "simulated": "SIMULATED"}[self.value]

    @staticmethod
    def label(value: str) -> str:
        """``short`` of a stored timing value; "" (no device told it), or a value that is none of
        ours, is "timing unknown": never read as measured."""
        try:
            return Timing(value).short
        except ValueError:
            return "timing unknown"

    @staticmethod
    def figures_of(value: str) -> str:
        """``figures`` of a stored timing value, as ``label`` treats one it does not know."""
        try:
            return Timing(value).figures
        except ValueError:
            return "timing unknown"

    @classmethod
    def of(cls, props: dict[str, str], virtual: bool | None) -> Timing:
        """A device's, from its properties: a virtual device announces a simulated phone's timing
        (``ro.ptefarm.timing=simulated``); a phone never does."""
        if not virtual:
            return cls.MEASURED
        return cls.SIMULATED if props.get("ro.ptefarm.timing") == "simulated" else cls.HOST_CPU


class DeviceState(StrEnum):
    """A device in the pool. ``leased`` is set while an unexpired lease exists and the device is
    otherwise healthy; ``quarantined`` and ``offline`` win over a lease (the holder keeps its lease,
    nobody new gets one)."""

    AVAILABLE = "available"
    LEASED = "leased"
    QUARANTINED = "quarantined"
    OFFLINE = "offline"


class Outcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"    # the code under test is wrong: JUnit <failure>, never re-run
    ERROR = "error"      # no verdict (ErrorKind says why): JUnit <error>
    SKIPPED = "skipped"


class ErrorKind(StrEnum):
    """Why a record is an ``error``."""

    INFRA = "infra"  # device gone, adb, timeout, pool down, lease lost: re-run elsewhere
    USAGE = "usage"  # bad input (a case that cannot run): never re-run


class Verdict(StrEnum):
    """A whole run. ``farm qualify`` exits 0, 1, 3, 2 for these (and 130 when interrupted)."""

    PASS = "pass"
    FAIL = "fail"                # a test failed: the code under test is wrong
    INFRA_ERROR = "infra-error"  # no failure, but the infrastructure kept some tests from a verdict
    BAD_INPUT = "bad-input"


class Purpose(StrEnum):
    """Why a run was made; the results store and ``farm history --purpose`` filter on it."""

    PR = "pr"
    NIGHTLY = "nightly"
    RELEASE = "release"
    ADHOC = "adhoc"


class EventKind(StrEnum):
    """An entry of the pool's event log."""

    ADDED = "added"              # a device the pool had not seen
    UPDATED = "updated"          # its properties changed
    ONLINE = "online"            # back after being offline
    OFFLINE = "offline"          # gone from its adb server, or not seen within the liveness bound
    QUARANTINED = "quarantined"  # too many infrastructure failures in a row
    RESTORED = "restored"        # `farm pool restore`
    INFRA_FAILURE = "infra_failure"
    FAILURES_RESET = "failures_reset"
    RECOVERY = "recovery"        # a rung of the recovery ladder climbed, or its verdict
    QUEUED = "queued"            # a request waits
    LEASED = "leased"
    RELEASED = "released"
    EXPIRED = "expired"          # the lease ran out before its release
    ABANDONED = "abandoned"      # a waiter that went away
    GAVE_UP = "gave_up"          # a waiter whose timeout passed
    TAGGED = "tagged"
    UNTAGGED = "untagged"
    PRUNED = "pruned"            # forgotten after pool.retention_days offline

    @property
    def infra_name(self) -> str | None:
        """The name a run's report gives this kind among its infrastructure events; None for a kind
        that tells of no trouble with the infrastructure."""
        return _INFRA_EVENT_NAMES.get(self)


_INFRA_EVENT_NAMES: dict[EventKind, str] = {
    EventKind.QUARANTINED: "quarantine", EventKind.OFFLINE: "offline", EventKind.EXPIRED: "release-lost",
    EventKind.INFRA_FAILURE: "infra-failure", EventKind.ONLINE: "online", EventKind.RESTORED: "restored",
    EventKind.RECOVERY: "recovery"}

# The purposes in order, as plain strings: for choices, messages and membership tests.
PURPOSES: tuple[str, ...] = tuple(p.value for p in Purpose)
