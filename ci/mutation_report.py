"""The mutation run's score per module, and every surviving mutant with its diff (from `mutmut`).

Killed: a test failed (or timed out) on the mutant. Survived: every test that reaches it passed. No
tests: no selected test reaches the mutated function (listed, not counted in the score)."""

from __future__ import annotations

import collections
import subprocess
import sys


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


def main() -> int:
    found = results()
    if not found:
        print("mutation_report: mutmut reported no mutants (did `mutmut run` fail? see mutants/)",
              file=sys.stderr)
        return 2
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, status in found.items():
        counts[module_of(name)][status] += 1
    print(f"{'module':<32} {'killed':>7} {'survived':>9} {'no tests':>9} {'score':>7}")
    total = collections.Counter()
    for module, c in sorted(counts.items()):
        killed = c["killed"] + c["timeout"]
        judged = killed + c["survived"]
        total.update(killed=killed, survived=c["survived"], none=c["no tests"])
        print(f"{module:<32} {killed:>7} {c['survived']:>9} {c['no tests']:>9} "
              f"{(100 * killed / judged if judged else 100):>6.1f}%")
    judged = total["killed"] + total["survived"]
    print(f"{'all':<32} {total['killed']:>7} {total['survived']:>9} {total['none']:>9} "
          f"{100 * total['killed'] / max(judged, 1):>6.1f}%")
    print("\nsurvivors (mutmut show NAME for the diff):")
    for name, status in sorted(found.items()):
        if status == "survived":
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
