"""The mutation run's own tools (ci/mutmut_cli.py, ci/mutation_report.py): what they leave out and how
they score, since a wrong score would call the verdict paths' tests stronger than they are."""

from __future__ import annotations

import collections
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


cli = _load("mutmut_cli")
report = _load("mutation_report")


@pytest.mark.parametrize(("literal", "sql"), [
    ('"SELECT * FROM queue WHERE id = ?"', True),
    ('"DELETE FROM queue WHERE id = ?"', True),
    ('" AND holder_pid = ?"', True),
    ("'UPDATE devices SET state = ?'", True),
    ('"id > ?"', True),  # a condition Pool.history puts together
    ('"serial = ?"', True),
    ('"released"', False),
    ('"is it = ?"', False),  # prose with a question mark is not a condition
    ('"Lease expired? ask the pool"', False),
    ('"holder died: {why}"', False),
    ('"the pool from which it came"', False),  # lower-case words are prose, not SQL
])
def test_sql_is_told_from_prose(literal, sql):
    assert cli.is_sql(literal) is sql


def test_only_the_case_mutants_of_sql_are_dropped():
    class Node:
        def __init__(self, value):
            self.value = value

    def operator(node):  # mutmut's three string mutants
        text = node.value[1:-1]
        yield from (Node(f'"XX{text}XX"'), Node(f'"{text.lower()}"'), Node(f'"{text.upper()}"'))

    narrowed = cli.without_sql_case(operator)
    sql = [m.value for m in narrowed(Node('"SELECT id FROM queue"'))]
    assert sql == ['"XXSELECT id FROM queueXX"']
    prose = [m.value for m in narrowed(Node('"Acquire interrupted"'))]
    assert prose == ['"XXAcquire interruptedXX"', '"acquire interrupted"', '"ACQUIRE INTERRUPTED"']


def test_a_mutant_no_test_reaches_counts_against_the_score():
    row = report._row("m", collections.Counter(killed=90, survived=5, equivalent=7, none=5))
    assert row.split()[-1] == "90.0%"  # 90 / (90 + 5 + 5): equivalents left out, untested counted
    assert report._row("m", collections.Counter(equivalent=3)).split()[-1] == "-"


def test_an_equivalent_is_matched_by_its_change_not_by_mutmuts_number(tmp_path, monkeypatch, capsys):
    # mutmut renumbers a function's mutants whenever the function changes: a judgement must follow
    # the change it judged (and drop out, listed, when that change is gone), never a number.
    (tmp_path / "farm.m.toml").write_text(
        '[[equivalent]]\nmutant = "farm.m.x_f__mutmut_3"\nmutated = "n = 3"\nreason = "same default"\n'
        '[[equivalent]]\nmutant = "farm.m.x_f__mutmut_9"\nmutated = "gone = 1"\nreason = "was so"\n'
        '[[equivalent]]\nmutant = "farm.other.x_g__mutmut_1"\nmutated = "x"\nreason = "not run"\n')
    load = report.load_equivalents
    monkeypatch.setattr(report, "load_equivalents", lambda: load(tmp_path))
    statuses = {"farm.m.x_f__mutmut_1": "killed", "farm.m.x_f__mutmut_5": "survived",
                "farm.m.x_f__mutmut_6": "survived", "farm.m.x_h__mutmut_5": "survived",
                # a run of farm.m alone lists the other modules' mutants as not checked
                "farm.other.x_g__mutmut_1": "not checked"}
    diffs = {"farm.m.x_f__mutmut_5": "+    n = 3", "farm.m.x_f__mutmut_6": "+    n = 4",
             "farm.m.x_h__mutmut_5": "+    n = 3"}  # the same text in another function is not it
    monkeypatch.setattr(report, "results", lambda: dict(statuses))
    monkeypatch.setattr(report, "diff_of", diffs.__getitem__)
    assert report.main([]) == 1  # a stale entry, and a score under 95 %
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("farm.m ")]
    assert row.split()[1:] == ["1", "2", "1", "0", "33.3%"]
    survivors = out.split("survivors")[1].split("stale equivalents")[0]
    assert "farm.m.x_f__mutmut_6" in survivors and "farm.m.x_h__mutmut_5" in survivors
    assert "farm.m.x_f__mutmut_5" not in survivors
    unused = out.split("stale equivalents, matching no survivor")[1].split("mutation report:")[0]
    assert "farm.m.x_f__mutmut_9" in unused and "farm.other" not in unused
    assert not any(line.startswith("farm.other") for line in out.splitlines())
    assert "FAILED: 1 stale equivalent(s); score 33.3% < 95%" in out


def test_the_report_fails_on_a_stale_entry_or_a_low_score_and_passes_otherwise(capsys):
    good = collections.Counter(killed=95, survived=5)
    assert report.verdict(good, [], 95.0) == 0
    assert report.verdict(collections.Counter(killed=94, survived=6), [], 95.0) == 1
    assert report.verdict(good, ["farm.m.x_f__mutmut_1"], 95.0) == 1
    assert report.verdict(collections.Counter(equivalent=3), [], 95.0) == 0  # nothing left to judge
    assert "FAILED" in capsys.readouterr().out


def test_an_entry_for_code_that_is_gone_or_changed_is_stale(tmp_path):
    """Read against mutmut's own mutants of the code as it is: an entry naming a function that is
    gone, or a change none of its mutants makes any more, is stale; one that still matches is not."""
    (tmp_path / "farm").mkdir()
    (tmp_path / "farm" / "m.py").write_text("def f(a, b):\n    return a + b\n\n\n"
                                             "class C:\n    def g(self):\n        return 3\n")
    entries = {}
    for mutant, mutated in (("farm.m.x_f__mutmut_1", "return a - b"),      # still made
                            ("farm.m.xǁCǁg__mutmut_1", "return 4"),        # still made
                            ("farm.m.x_f__mutmut_2", "return a * b * c"),  # no mutant makes it
                            ("farm.m.x_gone__mutmut_1", "return 1")):      # no such function
        e = report.Equivalent(mutant, mutated, "why", tmp_path / "farm.m.toml")
        entries[(report.function_of(mutant), mutated)] = e
    stale = {e.mutant: why for e, why in report.stale_entries(entries, tmp_path)}
    assert set(stale) == {"farm.m.x_f__mutmut_2", "farm.m.x_gone__mutmut_1"}, stale
    assert "no function gone" in stale["farm.m.x_gone__mutmut_1"]
    assert "no mutant of f makes this change" in stale["farm.m.x_f__mutmut_2"]


def test_every_module_that_decides_a_verdict_is_mutated():
    """The modules whose code decides a verdict or what a device holds are all in mutmut's
    source_paths (a parser of the device's answers that nothing mutates could be wrong unseen)."""
    import tomllib

    paths = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]["source_paths"])
    deciding = {"farm/execute/compare.py", "farm/execute/run.py", "farm/execute/deploy.py",
                "farm/execute/devicecmd.py", "farm/execute/chunkstore.py", "farm/results/gate.py",
                "farm/results/checks.py", "farm/results/outcome.py", "farm/retry.py",
                "farm/device/fence.py", "farm/bundle/manifest.py", "farm/pool/leases.py"}
    assert deciding <= paths, sorted(deciding - paths)
    assert all((REPO / p).is_file() for p in paths), sorted(p for p in paths if not (REPO / p).is_file())


def test_the_clean_run_is_skipped_only_after_a_full_stats_run_in_this_process():
    import types

    calls = []

    class Runner:
        def run_clean_tests(self, tests):
            calls.append(("clean", list(tests)))
            return 1  # a failing clean run: mutmut stops

    def run_stats_collection(runner, tests=None):
        calls.append(("stats", tests))

    def fresh_module():
        return types.SimpleNamespace(run_stats_collection=run_stats_collection,
                                     get_mutant_runner=lambda max_children: Runner())

    loaded = fresh_module()  # stats loaded from mutants/ (a resumed run), a few new tests collected
    cli.without_a_second_clean_run(loaded)
    loaded.run_stats_collection(None, tests=["t_new"])
    assert loaded.get_mutant_runner(2).run_clean_tests(["t"]) == 1
    assert calls == [("stats", ["t_new"]), ("clean", ["t"])]
    calls.clear()
    full = fresh_module()  # the full selection just ran clean in the stats step (its exit code checked)
    cli.without_a_second_clean_run(full)
    full.run_stats_collection(None)
    assert full.get_mutant_runner(2).run_clean_tests(["t"]) == 0
    assert calls == [("stats", None)]


def test_a_mutants_tests_run_in_two_rounds_with_the_verdict_of_one():
    ran = []

    class Runner:
        def run_tests(self, *, mutant_name, tests):
            ran.append(list(tests))
            return 1 if "kills" in tests else 0

    cli.in_two_rounds(Runner, first=2)
    tests = ["fast", "quick", "slow", "kills", "slowest"]
    assert Runner().run_tests(mutant_name="m__mutmut_1", tests=tests) == 1
    assert ran == [["fast", "quick"], ["slow", "kills", "slowest"]]  # the rest only after a pass
    ran.clear()
    assert Runner().run_tests(mutant_name="m__mutmut_2", tests=["kills", *tests]) == 1
    assert ran == [["kills", "fast"]]  # killed in the first round: the rest never collected
    ran.clear()
    assert Runner().run_tests(mutant_name="m__mutmut_3", tests=["a", "b", "c"]) == 0
    assert ran == [["a", "b"], ["c"]]  # a survivor ran every test
    ran.clear()
    assert Runner().run_tests(mutant_name=None, tests=tests) == 1  # the clean run: one round
    assert ran == [tests]


def test_a_mutant_judged_equivalent_is_not_run_unless_a_recheck_is_asked(tmp_path, monkeypatch, capsys):
    (tmp_path / "farm.m.toml").write_text(
        '[[equivalent]]\nmutant = "farm.m.x_f__mutmut_3"\nmutated = "n = 3"\nreason = "same default"\n')
    load = report.load_equivalents
    monkeypatch.setattr(report, "load_equivalents", lambda: load(tmp_path))
    diffs = {"farm.m.x_f__mutmut_5": "+    n = 3", "farm.m.x_f__mutmut_6": "+    n = 4"}
    looked: list[str] = []
    monkeypatch.setattr(report, "diff_of", lambda name: looked.append(name) or diffs[name])
    ran = []

    class Runner:
        def run_tests(self, *, mutant_name, tests):
            ran.append(mutant_name)
            return 0

    cli.skipping_judged_equivalents(Runner, str(tmp_path))
    monkeypatch.delenv(cli.RECHECK_ENV, raising=False)
    assert Runner().run_tests(mutant_name="farm.m.x_f__mutmut_5", tests=["t"]) == cli.SKIPPED
    assert Runner().run_tests(mutant_name="farm.m.x_f__mutmut_6", tests=["t"]) == 0  # another change
    assert Runner().run_tests(mutant_name="farm.m.x_g__mutmut_1", tests=["t"]) == 0  # no judgement
    assert ran == ["farm.m.x_f__mutmut_6", "farm.m.x_g__mutmut_1"]
    assert "farm.m.x_g__mutmut_1" not in looked  # a function without judgements is not even diffed
    monkeypatch.setenv(cli.RECHECK_ENV, "1")
    assert Runner().run_tests(mutant_name="farm.m.x_f__mutmut_5", tests=["t"]) == 0  # run after all
    monkeypatch.delenv(cli.RECHECK_ENV)
    # The report counts a skipped, judged mutant as equivalent, and says that it was not run.
    monkeypatch.setattr(report, "results", lambda: {"farm.m.x_f__mutmut_5": "skipped",
                                                    "farm.m.x_f__mutmut_6": "killed"})
    assert report.main([]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("farm.m ")]
    assert row.split()[1:] == ["1", "0", "1", "0", "100.0%"]
    assert "judged equivalents were not run" in out and "equivalents matching no survivor" not in out
