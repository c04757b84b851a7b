"""What the benchmarks share: the targets each one judges itself, and ratios quoted with their spread.

A benchmark states its targets as ``Target`` values, prints one ``target met:`` / ``target MISSED:``
line per target before its summary, and exits 1 when one is missed: a target only printed is a
target nobody is held to. ``--target KEY=LIMIT`` sets a limit for one run (a stricter bar, a looser
one on a slow host, or one that cannot be met, to see the bench fail).

A ratio over rounds is quoted as its median with the spread (min-max) of the rounds: one round's
figure says nothing of how far the next one lands.
"""

from __future__ import annotations

import argparse
import math
import operator
import statistics
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

OPS = {"<": operator.lt, "<=": operator.le, ">=": operator.ge, ">": operator.gt}


@dataclass(frozen=True)
class Target:
    key: str    # its name for --target
    what: str   # the figure, as the output names it
    op: str     # one of OPS: the figure must be <op> limit
    limit: float
    unit: str = ""
    fmt: str = ".3f"

    def met_by(self, value: float) -> bool:
        return OPS[self.op](value, self.limit)  # NaN (nothing measured) meets nothing

    def describe(self) -> str:
        return f"{self.what} {self.op} {self.limit:g}{self.unit}"


@dataclass(frozen=True)
class Verdict:
    target: Target
    value: float

    @property
    def met(self) -> bool:
        return self.target.met_by(self.value)

    def line(self) -> str:
        t = self.target
        return (f"target {'met' if self.met else 'MISSED'}: {t.what} {self.value:{t.fmt}}{t.unit} "
                f"(target {t.op} {t.limit:g}{t.unit}; --target {t.key}=LIMIT)")


def add_target_option(parser: argparse.ArgumentParser, targets: Iterable[Target]) -> None:
    keys = ", ".join(f"{t.key} ({t.describe()})" for t in targets)
    parser.add_argument("--target", action="append", default=[], metavar="KEY=LIMIT",
                        help=f"this run's limit for a target, instead of the stated one; {keys}")


def with_overrides(targets: Sequence[Target], settings: Sequence[str]) -> dict[str, Target]:
    """The targets by key, with ``KEY=LIMIT`` settings applied; an unknown key or a limit that is no
    number stops the bench before it measures anything."""
    out = {t.key: t for t in targets}
    for setting in settings:
        key, sep, limit = setting.partition("=")
        if not sep or key not in out:
            raise SystemExit(f"--target {setting}: expected KEY=LIMIT with KEY one of {', '.join(out)}")
        try:
            out[key] = replace(out[key], limit=float(limit))
        except ValueError:
            raise SystemExit(f"--target {setting}: {limit!r} is not a number") from None
    return out


def judge(measured: Iterable[tuple[Target, float]]) -> list[Verdict]:
    return [Verdict(t, v) for t, v in measured]


def print_verdicts(verdicts: Sequence[Verdict]) -> int:
    """One line per target, then the exit code: 1 when any was missed."""
    for v in verdicts:
        print(v.line())
    return 0 if all(v.met for v in verdicts) else 1


def targets_met(verdicts: Sequence[Verdict]) -> str:
    """For the summary line: which targets were missed, by name."""
    missed = [v.target.describe() for v in verdicts if not v.met]
    met = f"targets met {len(verdicts) - len(missed)}/{len(verdicts)}"
    return met + (f" (MISSED: {'; '.join(missed)})" if missed else "")


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        xs = list(values)
        if not xs:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(xs), min(xs), max(xs), len(xs))

    def format(self, fmt: str = ".2f") -> str:
        """``median (min-max)``; a single round says so rather than showing a spread it does not have."""
        if self.n < 2:
            return f"{self.median:{fmt}} (1 round)"
        return f"{self.median:{fmt}} ({self.low:{fmt}}-{self.high:{fmt}})"
