"""The exit codes of every ``farm`` command, in one table.

| code | name         | meaning                                                                       |
|------|--------------|-------------------------------------------------------------------------------|
| 0    | OK           | done; every test passed                                                       |
| 1    | TEST_FAILURE | the code under test failed: a test failed, a runner exited non-zero           |
| 2    | BAD_INPUT    | bad input: a file, flag, config key, lease token, a request past the context  |
| 3    | INFRA        | infrastructure: device gone or quarantined, adb, timeout, pool down, no lease |
| 4    | REGRESSION   | every test passed, but throughput regressed against the baseline (the gate)   |
| 130  | INTERRUPTED  | interrupted (SIGINT/SIGTERM) before a verdict                                 |

``farm pool exec`` is the one exception by design: it returns its command's own exit code (128+N for
a command killed by signal N), and one of these only for what happened before or around the command.
"""

from __future__ import annotations

from enum import IntEnum

from farm.errors import FarmError, InfraError, UsageError
from farm.vocab import Verdict

__all__ = ["ExitCode", "for_error", "for_verdict"]


class ExitCode(IntEnum):
    OK = 0
    TEST_FAILURE = 1
    BAD_INPUT = 2
    INFRA = 3
    REGRESSION = 4
    INTERRUPTED = 130


def for_error(error: BaseException) -> ExitCode:
    """The exit code a command ends with when ``error`` escapes it."""
    if isinstance(error, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    if isinstance(error, InfraError):
        return ExitCode.INFRA
    if isinstance(error, UsageError):
        return ExitCode.BAD_INPUT
    if isinstance(error, AssertionError):  # farm.execute.run.RunnerFailed: the code under test failed
        return ExitCode.TEST_FAILURE
    if isinstance(error, FarmError):
        return ExitCode.BAD_INPUT
    raise TypeError(f"no exit code for {type(error).__name__}: not a farm error")


def for_verdict(verdict: Verdict | str) -> ExitCode:
    """The exit code of a run with this verdict (the regression gate and interruption aside)."""
    return {Verdict.PASS: ExitCode.OK, Verdict.FAIL: ExitCode.TEST_FAILURE,
            Verdict.BAD_INPUT: ExitCode.BAD_INPUT, Verdict.INFRA_ERROR: ExitCode.INFRA}[Verdict(verdict)]
