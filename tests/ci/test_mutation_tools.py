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
    ('"released"', False),
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
