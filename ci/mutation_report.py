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
REPO = Path(__file__).resolve().parents[1]
MIN_SCORE = 95.0  # percent: below it the report fails


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


def current_changes(module: str, functions: set[str], repo: Path = REPO) -> dict[str, set[str]]:
    """What mutmut makes of ``functions`` of ``module`` as it is now: function (mutmut's name, e.g.
    ``farm.execute.deploy.x__discard``) -> the mutated lines of each of its mutants. No run, no
    files written: mutmut's own generator (``create_mutations``) on the source."""
    import difflib

    import libcst as cst
    from mutmut.mutation.file_mutation import create_mutations

    path = repo / (module.replace(".", "/") + ".py")
    if not path.is_file():
        return {}
    tree, mutations, _, _ = create_mutations(str(path), path.read_text())
    names: dict[cst.FunctionDef, str] = {}  # each top-level function and method: mutmut's name of it
    for child in tree.body:
        if isinstance(child, cst.FunctionDef):
            names[child] = f"x_{child.name.value}"
        elif isinstance(child, cst.ClassDef) and isinstance(child.body, cst.IndentedBlock):
            for m in child.body.body:
                if isinstance(m, cst.FunctionDef):
                    names[m] = f"xǁ{child.name.value}ǁ{m.name.value}"
    wanted = {f.rpartition(".")[-1] for f in functions}
    changes: dict[str, set[str]] = collections.defaultdict(set)
    for m in mutations:
        function = m.contained_by_top_level_function
        name = names.get(function) if function is not None else None
        if name not in wanted:
            continue
        mutant = function.deep_replace(m.original_node, m.mutated_node)
        diff = "\n".join(difflib.unified_diff(tree.code_for_node(function).split("\n"),
                                              tree.code_for_node(mutant).split("\n"), lineterm=""))
        changes[f"{module}.{name}"].add(mutated_lines(diff))
    return changes


def stale_entries(equivalents: dict[tuple[str, str], Equivalent],
                  repo: Path = REPO) -> list[tuple[Equivalent, str]]:
    """Entries that no longer describe the code, each with why: their function is gone (removed,
    renamed or moved), or none of its mutants makes their change any more (the code changed). A
    judgement of code that is not there is no judgement: the report fails on it."""
    stale = []
    entries = sorted(equivalents.values(), key=lambda e: e.mutant)
    judged: dict[str, set[str]] = collections.defaultdict(set)
    for e in entries:
        judged[module_of(e.mutant)].add(function_of(e.mutant))
    by_module = {module: current_changes(module, functions, repo) for module, functions in judged.items()}
    for e in entries:
        module = module_of(e.mutant)
        changes = by_module[module]
        function = function_of(e.mutant)
        if function not in changes:
            stale.append((e, f"{module} has no function {_shown(function[len(module) + 1:])} (any more)"))
        elif e.mutated not in changes[function]:
            stale.append((e, f"no mutant of {_shown(function[len(module) + 1:])} makes this change any "
                             f"more: {e.mutated[:120]!r}"))
    return stale


def _shown(name: str) -> str:
    """mutmut's ``x_name`` or ``xǁClassǁname`` as Python spells it."""
    return name[2:] if name.startswith("x_") else name[2:].replace("ǁ", ".")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--diffs", action="store_true", help="print each survivor's diff")
    parser.add_argument("--stale", action="store_true",
                        help="only check every module's entries against the code as it is (no run needed)")
    parser.add_argument("--min-score", type=float, default=MIN_SCORE,
                        help=f"fail below this score, percent [default: {MIN_SCORE:g}]")
    args = parser.parse_args(argv)
    if args.stale:
        stale = stale_entries(load_equivalents())
        for e, why in stale:
            print(f"stale: {e.mutant} ({e.source.name}): {why}")
        print(f"{len(stale)} stale entr{'y' if len(stale) == 1 else 'ies'}")
        return 1 if stale else 0
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
        if status != "not checked":  # a run of some modules lists the others' mutants unchecked
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
        print("\nstale equivalents, matching no survivor of this run (the code changed, or a test kills "
              "the mutant now: drop them):")
        for name in unused:
            print(f"  {name}")
    if any(s == "equivalent" for s in found.values()) and os.environ.get("PTEFARM_MUTATION_RECHECK") != "1":
        print("\n(judged equivalents were not run; PTEFARM_MUTATION_RECHECK=1 ci/mutation.sh runs them, "
              "and lists any that a test now kills)")
    return verdict(total, unused, args.min_score)


def verdict(total: collections.Counter, stale: list[str], min_score: float) -> int:
    """The report's exit code: 1 when an entry is stale (a judgement of code that is not there is
    no judgement) or the score is below ``min_score``; prints why. 0 otherwise."""
    judged = total["killed"] + total["survived"] + total["none"]
    score = 100 * total["killed"] / judged if judged else 100.0
    problems = []
    if stale:
        problems.append(f"{len(stale)} stale equivalent(s)")
    if score < min_score:
        problems.append(f"score {score:.1f}% < {min_score:g}%")
    print(f"\nmutation report: {'FAILED: ' + '; '.join(problems) if problems else 'passed'} "
          f"(score {score:.1f}%, at least {min_score:g}%)")
    return 1 if problems else 0


def _row(module: str, c: collections.Counter) -> str:
    judged = c["killed"] + c["survived"] + c["none"]
    score = f"{100 * c['killed'] / judged:>6.1f}%" if judged else f"{'-':>7}"
    return (f"{module:<32} {c['killed']:>7} {c['survived']:>9} {c['equivalent']:>11} {c['none']:>9} "
            f"{score}")


if __name__ == "__main__":
    sys.exit(main())
