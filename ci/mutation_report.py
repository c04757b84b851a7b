"""The mutation run's score per module, and every surviving mutant with its diff (from `mutmut`).

Killed: a test failed (or timed out) on the mutant. Survived: every test that reaches it passed.
Equivalent: a survivor judged to behave exactly as the original, recorded with its reason in
`ci/mutation_equivalents/<module>.toml`. An entry is matched by its function and the change it makes
(the mutated lines), not by mutmut's number, which shifts whenever the function changes; an entry that
matches no survivor of the run (the code changed, or a test kills it now) is listed, to be dropped.
No tests: no selected test reaches the mutated function: nothing would notice it, so it counts as
not killed (select a test that reaches it, or judge it equivalent).

The score is killed / (killed + survived + no tests), equivalents left out."""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

EQUIVALENTS = Path(__file__).resolve().parent / "mutation_equivalents"


@dataclass(frozen=True)
class Equivalent:
    mutant: str
    mutated: str  # the mutant's added lines, stripped and joined by newlines, as `mutated_lines` gives
    reason: str
    source: Path


def results() -> dict[str, str]:
    out = subprocess.run(["mutmut", "results", "--all", "true"], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep:
            found[name] = status
    return found


def module_of(mutant: str) -> str:
    return mutant.split(".x_")[0].split(".xǁ")[0]


def diff_of(mutant: str) -> str:
    # In-process: `mutmut show` costs a second and a half of start-up per mutant.
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    return get_diff_for_mutant(mutant)


def mutated_lines(diff: str) -> str:
    return "\n".join(line[1:].strip() for line in diff.splitlines()
                     if line.startswith("+") and not line.startswith("+++"))


def function_of(mutant: str) -> str:
    return mutant.rpartition("__mutmut_")[0]


def load_equivalents(folder: Path = EQUIVALENTS) -> dict[tuple[str, str], Equivalent]:
    """(function, mutated lines) -> the entry judging that change equivalent."""
    found: dict[tuple[str, str], Equivalent] = {}
    for path in sorted(folder.glob("*.toml")):
        try:
            entries = tomllib.loads(path.read_text()).get("equivalent", [])
        except tomllib.TOMLDecodeError as e:
            raise SystemExit(f"{path}: not a list of [[equivalent]] entries ({e})") from e
        for i, entry in enumerate(entries):
            missing = {"mutant", "mutated", "reason"} - entry.keys()
            if missing:
                raise SystemExit(f"{path}: entry {i + 1} lacks {', '.join(sorted(missing))}")
            if not entry["reason"].strip():
                raise SystemExit(f"{path}: entry {i + 1} ({entry['mutant']}) gives no reason")
            judged = Equivalent(entry["mutant"], entry["mutated"].strip(), entry["reason"], path)
            found[(function_of(judged.mutant), judged.mutated)] = judged
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--diffs", action="store_true", help="print each survivor's diff")
    args = parser.parse_args(argv)
    found = results()
    if not found:
        print("mutation_report: mutmut reported no mutants (did `mutmut run` fail? see mutants/)",
              file=sys.stderr)
        return 2
    equivalents = load_equivalents()
    used: set[tuple[str, str]] = set()
    survivors: dict[str, str] = {}
    for name, status in found.items():
        if status not in ("survived", "no tests", "skipped"):
            continue
        diff = diff_of(name)
        key = (function_of(name), mutated_lines(diff))
        if key in equivalents:
            found[name] = "equivalent"
            used.add(key)
            continue
        if status in ("survived", "skipped"):  # skipped unmatched: the entries changed under the run
            found[name] = "survived"
            survivors[name] = diff
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, status in found.items():
        counts[module_of(name)][status] += 1
    header = f"{'module':<32} {'killed':>7} {'survived':>9} {'equivalent':>11} {'no tests':>9} {'score':>7}"
    print(header)
    total: collections.Counter = collections.Counter()
    for module, c in sorted(counts.items()):
        killed = c["killed"] + c["timeout"]
        row = collections.Counter(killed=killed, survived=c["survived"], equivalent=c["equivalent"],
                                  none=c["no tests"])
        total.update(row)
        print(_row(module, row))
    print(_row("all", total))
    if survivors:
        print("\nsurvivors (`mutmut show NAME` for the diff; --diffs prints them here):")
        for name, diff in sorted(survivors.items()):
            print(f"  {name}")
            if args.diffs:
                print("\n".join("      " + line for line in diff.splitlines()))
    # Only the modules this run mutated: a run of one module says nothing of the others' entries.
    unused = sorted(e.mutant for key, e in equivalents.items()
                    if key not in used and module_of(e.mutant) in counts)
    if unused:
        print("\nequivalents matching no survivor of this run (the code changed, or a test kills the "
              "mutant now: drop them):")
        for name in unused:
            print(f"  {name}")
    if any(s == "equivalent" for s in found.values()) and os.environ.get("PTEFARM_MUTATION_RECHECK") != "1":
        print("\n(judged equivalents were not run; PTEFARM_MUTATION_RECHECK=1 ci/mutation.sh runs them, "
              "and lists any that a test now kills)")
    return 0


def _row(module: str, c: collections.Counter) -> str:
    judged = c["killed"] + c["survived"] + c["none"]
    score = f"{100 * c['killed'] / judged:>6.1f}%" if judged else f"{'-':>7}"
    return (f"{module:<32} {c['killed']:>7} {c['survived']:>9} {c['equivalent']:>11} {c['none']:>9} "
            f"{score}")


if __name__ == "__main__":
    sys.exit(main())
