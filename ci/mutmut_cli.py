"""mutmut's command line (pinned mutmut==3.8.1), with its string operator told that SQL ignores case,
without its second clean run of the tests (``without_a_second_clean_run``), running a mutant's tests
in two rounds (``in_two_rounds``) and not running the mutants already judged equivalent
(``skipping_judged_equivalents``; ``PTEFARM_MUTATION_RECHECK=1`` runs them too).

mutmut mutates every string literal three ways: "XX" around it, all lower case, all upper case. In a
SQL statement the two case changes are equivalent mutants by definition (keywords and unquoted
identifiers are case-insensitive on SQLite and PostgreSQL), and each equivalent mutant costs a full run
of the tests that reach it (up to 15 s each in farm.pool.leases): dropping them took the verdict modules
from 3,833 mutants to 3,759, nearly all of the 74 in the leases. They are dropped here, before they are
generated; the "XX" mutant of every statement is kept (it breaks the SQL, and a test must notice).

Written by hand because mutmut has no option for it: its operators are a plain list, patched before
its CLI runs (mutmut forks its workers, so they inherit the patch).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

_SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|WITH)\b"
                  r"|\b(FROM|WHERE|AND|OR|ORDER BY|GROUP BY|SET|VALUES|IS NULL|LIMIT)\b"
                  # a condition built up piece by piece: `column = ?` (a placeholder after an operator)
                  r"|^\s*\w+\s*(=|<>|!=|<=|>=|<|>)\s*\?\s*$")


def _text(literal: str) -> str:
    """The text of a simple string literal, without its prefix and quotes."""
    return literal.lstrip("rRbBuUfF")[1:-1]


def is_sql(literal: str) -> bool:
    """A statement or a clause of one, as this code base writes them: keywords in upper case."""
    return bool(_SQL.search(_text(literal)))


def case_only_sql(original: str, mutated: str) -> bool:
    """A mutant of a SQL literal that changed nothing but its case."""
    return is_sql(original) and mutated != original and mutated.lower() == original.lower()


def without_sql_case(operator: Callable[[Any], Iterable[Any]]) -> Callable[[Any], Iterable[Any]]:
    """mutmut's string operator, less the mutants `case_only_sql` names."""

    def operator_string(node: Any) -> Iterable[Any]:
        for mutant in operator(node):
            before, after = getattr(node, "value", None), getattr(mutant, "value", None)
            if isinstance(before, str) and isinstance(after, str) and case_only_sql(before, after):
                continue
            yield mutant

    return operator_string


def without_a_second_clean_run(main_module: Any) -> None:
    """After a full stats collection in this process, mutmut's "clean tests" step runs the very same
    selection on the very same unmutated code again (minutes: the selection's whole run). The stats
    step already fails the run on any failing test, so the repeat is skipped then; stats loaded from
    an earlier run (mutants/ kept) still get their clean run."""
    collect, get_runner = main_module.run_stats_collection, main_module.get_mutant_runner
    fresh = {"full": False}

    def run_stats_collection(runner: Any, tests: Iterable[str] | None = None) -> None:
        collect(runner, tests)
        fresh["full"] = fresh["full"] or not tests  # exits the process on a failing test

    def get_mutant_runner(*args: Any, **kwargs: Any) -> Any:
        runner = get_runner(*args, **kwargs)
        clean = runner.run_clean_tests
        runner.run_clean_tests = lambda tests: 0 if fresh["full"] else clean(tests)
        return runner

    main_module.run_stats_collection = run_stats_collection
    main_module.get_mutant_runner = get_mutant_runner


FIRST_TESTS = 24


def in_two_rounds(runner_class: Any, first: int = FIRST_TESTS) -> None:
    """A mutant's tests (mutmut hands them over fastest first, and stops at the first failure) run as
    the ``first`` fastest, then, only if all of those passed, the rest: the same tests, in the same
    order, with the same verdict. What it saves is pytest's collection of every test file a widely
    used function is reached from (a bundle's ``load``: hundreds of tests in dozens of files), which
    each of its mutants paid before its first, fast test failed."""
    run_tests = runner_class.run_tests

    def in_rounds(self: Any, *, mutant_name: str | None, tests: Iterable[str]) -> int:
        tests = list(tests)
        if mutant_name is None or len(tests) <= first:
            return run_tests(self, mutant_name=mutant_name, tests=tests)
        code = run_tests(self, mutant_name=mutant_name, tests=tests[:first])
        return code if code != 0 else run_tests(self, mutant_name=mutant_name, tests=tests[first:])

    runner_class.run_tests = in_rounds


SKIPPED = 34  # mutmut's exit code for "skipped"; ci/mutation_report.py counts a matched one as equivalent
RECHECK_ENV = "PTEFARM_MUTATION_RECHECK"


def skipping_judged_equivalents(runner_class: Any, root: str) -> None:
    """A mutant that ``ci/mutation_equivalents/`` judges equivalent (matched, as the report matches
    it, by its function and the lines it changes) is not run: it survives by definition, and each
    costs every test that reaches its function (20 s for one of ``deploy``'s: a fifth of the whole
    run went to them). ``PTEFARM_MUTATION_RECHECK=1`` runs them all the same, which is how an entry
    that a new test kills is found (the report then lists it, to be dropped)."""
    run_tests = runner_class.run_tests
    judged: dict[str, Any] = {}

    def equivalent(mutant_name: str) -> bool:
        import mutation_report as report  # ci/, on sys.path as this script's folder

        if "keys" not in judged:
            judged["keys"] = report.load_equivalents()
            judged["functions"] = {function for function, _ in judged["keys"]}
        function = report.function_of(mutant_name)
        if function not in judged["functions"]:
            return False
        here = os.getcwd()
        os.chdir(root)  # mutmut's diff reads mutants/ from the project's root
        try:
            key = (function, report.mutated_lines(report.diff_of(mutant_name)))
        finally:
            os.chdir(here)
        return key in judged["keys"]

    def run(self: Any, *, mutant_name: str | None, tests: Iterable[str]) -> int:
        if mutant_name is not None and os.environ.get(RECHECK_ENV) != "1":
            try:
                if equivalent(mutant_name):
                    return SKIPPED
            except Exception as e:  # noqa: BLE001 - a judgement that cannot be read: run the tests
                print(f"mutmut_cli: {mutant_name}: not matched against the equivalents: {e}",
                      file=sys.stderr)
        return run_tests(self, mutant_name=mutant_name, tests=tests)

    runner_class.run_tests = run


def main() -> None:
    import mutmut.__main__ as main_module
    from mutmut.runners.harness import PytestRunner
    from mutmut.__main__ import cli
    from mutmut.mutation import mutators

    original = mutators.operator_string
    # In place: mutmut's file_mutation holds this very list.
    mutators.mutation_operators[:] = [
        (kind, without_sql_case(original) if operator is original else operator)
        for kind, operator in mutators.mutation_operators]
    without_a_second_clean_run(main_module)
    in_two_rounds(PytestRunner)
    skipping_judged_equivalents(PytestRunner, os.getcwd())  # outermost: a skipped mutant runs nothing
    sys.argv[0] = "mutmut"
    cli()


if __name__ == "__main__":
    main()
