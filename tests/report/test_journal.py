"""The journal a run keeps beside its report directory: a write cut short by a full file system loses
only its own line, and recovery never merges the records of two runs into one report."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from farm.errors import UsageError
from farm.report.directory import recover
from farm.results.records import ResultLog, TestRecord, journal_paths, set_aside_paths
from farm.vocab import Outcome
from tests.support.plugin import results_json

# A journal written under a file-size limit (RLIMIT_FSIZE) that a record crosses: the kernel writes
# what fits and refuses the rest (EFBIG), as a full file system does with ENOSPC. Then either room
# comes back and the run journals on ("room"), or the host dies while it is full ("kill").
TORN = textwrap.dedent("""
    import os, resource, signal, sys
    from farm.results.records import ResultLog, TestRecord
    from farm.vocab import Outcome

    path, then = sys.argv[1:]
    log = ResultLog(path, "run-a")
    rec = lambda i: TestRecord(f"t.py::test_{i}", Outcome.PASSED, message="x" * 300)
    for i in range(3):
        log.add(rec(i))
    size = log.path.stat().st_size
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))
    for i in (3, 4):
        try:
            log.add(rec(i))
        except OSError as e:
            print("refused", e.errno, flush=True)
    if then == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    for i in range(5, 10):
        log.add(rec(i))
    log.close()
""")


def _torn_journal(path, then: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", TORN, str(path), then], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.count("refused") == 2, proc.stdout + proc.stderr  # the file system was full
    return proc


def _nodeids(*numbers: int) -> list[str]:
    return [f"t.py::test_{i}" for i in numbers]


def test_records_refused_by_a_full_file_system_are_journaled_whole_once_there_is_room(tmp_path):
    path = tmp_path / ".out.results.jsonl"
    assert _torn_journal(path, "room").returncode == 0
    assert [r.nodeid for r in ResultLog.read(path)] == _nodeids(*range(10))


def test_a_line_torn_by_a_full_file_system_loses_only_itself(tmp_path):
    path = tmp_path / ".out.results.jsonl"
    _torn_journal(path, "kill")  # died with part of record 3 on disk
    assert b'"t.py::test_3"' in path.read_bytes() and not path.read_bytes().endswith(b"\n")
    assert [r.nodeid for r in ResultLog.read(path)] == _nodeids(0, 1, 2)
    log = ResultLog(path, "run-a")  # whoever journals next there
    for i in range(5, 8):
        log.add(TestRecord(f"t.py::test_{i}", Outcome.PASSED))
    log.close()
    assert [r.nodeid for r in ResultLog.read(path)] == _nodeids(0, 1, 2, 5, 6, 7)


def _journal(out, run_id, nodeids, *, meta=True):
    log_path, meta_path = journal_paths(out)
    log = ResultLog(log_path, run_id)
    for n in nodeids:
        log.add(TestRecord(n, Outcome.PASSED))
    log.close()
    if meta:
        meta_path.write_text(json.dumps({"run_id": run_id}))


def test_recovery_of_a_journal_two_runs_wrote_names_them_and_merges_neither(tmp_path):
    out = tmp_path / "out"
    _journal(out, "run-a", ["t.py::test_x", "t.py::test_y"])
    _journal(out, "run-b", ["t.py::test_x"])  # a second run appended to the same journal
    with pytest.raises(UsageError, match="run-a, run-b.*--run"):
        recover(out)
    assert not out.exists()
    written = recover(out, "run-a")
    body = results_json(written)
    assert body["meta"]["run_id"] == "run-a"
    assert [r["nodeid"] for r in body["results"]] == ["t.py::test_x", "t.py::test_y"]
    # run-b's line is still journaled; recovered, it goes beside run-a's report, never over it.
    assert [r.nodeid for r in ResultLog.read(journal_paths(out)[0], "run-b")] == ["t.py::test_x"]
    again = recover(out, "run-b")
    assert again != out and results_json(out)["meta"]["run_id"] == "run-a"
    assert results_json(again)["meta"]["run_id"] == "run-b"
    assert [r["nodeid"] for r in results_json(again)["results"]] == ["t.py::test_x"]
    assert not journal_paths(out)[0].exists()


def test_a_journal_set_aside_by_a_later_run_is_recovered_by_its_run_id(tmp_path):
    out = tmp_path / "out"
    log_path, meta_path = set_aside_paths(out, "run-a")
    log = ResultLog(log_path, "run-a")
    log.add(TestRecord("t.py::test_a", Outcome.PASSED))
    log.close()
    meta_path.write_text(json.dumps({"run_id": "run-a", "purpose": "nightly"}))
    _journal(out, "run-b", ["t.py::test_b"])
    with pytest.raises(UsageError, match="run-a, run-b"):
        recover(out)
    body = results_json(recover(out, "run-a"))
    assert body["meta"]["purpose"] == "nightly"
    assert [r["nodeid"] for r in body["results"]] == ["t.py::test_a"]
    assert not log_path.exists() and not meta_path.exists()
    assert [r["nodeid"] for r in results_json(recover(out))["results"]] == ["t.py::test_b"]
