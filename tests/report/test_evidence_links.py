"""A test's device evidence is reachable from every report: the JUnit (system-err and the
``[[ATTACHMENT|path]]`` lines CI JUnit plugins read), results.json and report.html."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from farm.report.html import render_html
from farm.report.junit import junit_suite
from farm.report.qualification import qualification_report
from farm.results.jsonfile import load_results, results_json
from farm.results.records import Attempt, QualificationResults, TestRecord
from farm.vocab import ErrorKind, Outcome

FILES = ["evidence/t.py_test_a_SM8650/logcat.txt", "evidence/t.py_test_a_SM8650/tombstone_00"]


def _failed(**kw) -> TestRecord:
    return TestRecord("t.py::test_a[SM8650]", Outcome.FAILED, soc="SM8650", serial="R5CW1234ABC",
                      message="updaters diverge at token 3", details="Traceback ...",
                      error_type="AssertionError", evidence=list(FILES), **kw)


def _case(record: TestRecord, meta: dict) -> ET.Element:
    suite = junit_suite("R5CW1234ABC", [record], meta)
    return suite.find("testcase")


def test_junit_links_each_evidence_file_by_absolute_path_on_a_line_of_its_own():
    case = _case(_failed(), {"report_dir": "/ci/reports/latest"})
    err = case.find("system-err").text
    lines = err.splitlines()
    for path in FILES:
        assert f"[[ATTACHMENT|/ci/reports/latest/{path}]]" in lines
        assert f"  {path}" in lines  # and readable by a person, relative to the report directory
    # the failure itself is untouched: still a failure with its message and details
    failure = case.find("failure")
    assert failure.get("message") == "updaters diverge at token 3" and failure.text == "Traceback ..."
    assert case.find("error") is None


def test_junit_keeps_spoiled_attempts_beside_the_evidence_of_an_error():
    record = _failed(attempts=[Attempt("R5CW0000", "DeviceGone: gone")])
    record.outcome, record.error_kind, record.error_type = Outcome.ERROR, ErrorKind.INFRA, "DeviceGone"
    err = _case(record, {"report_dir": "/r"}).find("system-err").text
    assert err.startswith("attempt 1: R5CW0000: DeviceGone: gone\n")
    assert "[[ATTACHMENT|/r/evidence/t.py_test_a_SM8650/logcat.txt]]" in err.splitlines()


def test_a_test_without_evidence_has_no_attachment_lines():
    record = _failed()
    record.evidence = []
    assert _case(record, {"report_dir": "/r"}).find("system-err") is None


def test_results_json_keeps_the_evidence_paths(tmp_path):
    (tmp_path / "results.json").write_text(results_json([_failed()], {"run_id": "r1"}))
    assert load_results(tmp_path).records[0].evidence == FILES


def test_html_links_the_evidence_relative_to_the_report_and_never_a_hostile_path():
    record = _failed()
    record.evidence = FILES + ["../../etc/passwd", "/etc/shadow", "javascript:alert(1)",
                               'evidence/x/"><script>.txt']
    text = render_html(qualification_report(QualificationResults(
        {"run_id": "r1", "bundle_name": "tiny", "verdict": "fail"}, [record])))
    assert '<a href="evidence/t.py_test_a_SM8650/logcat.txt">logcat.txt</a>' in text
    assert '<a href="evidence/t.py_test_a_SM8650/tombstone_00">tombstone_00</a>' in text
    assert 'href="../' not in text and 'href="/etc' not in text and 'href="javascript:' not in text
    assert "<script>" not in text
    assert "updaters diverge at token 3" in text
