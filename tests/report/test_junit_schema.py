"""The farm's JUnit is valid against junit-10.xsd (Jenkins' xUnit plugin's JUnit format, the schema
pytest validates its own --junitxml with), but for the two extensions it makes on each testcase (its
properties and its file); and the check itself refuses what the schema refuses. (pytest's
--junitxml of a farm run is validated in tests/fixtures/test_junitxml.py.)"""

from __future__ import annotations

import pytest

from farm.report.directory import write_reports
from farm.results.records import Attempt, TestRecord
from farm.vocab import ErrorKind, Outcome
from tests.support.junit_schema import valid_junit


def _records() -> list[TestRecord]:
    failed = TestRecord("t.py::test_a[SM8650]", Outcome.FAILED, soc="SM8650", serial="R5CW1234ABC",
                        message="updaters diverge at token 3", details="Traceback ...",
                        error_type="AssertionError", evidence=["evidence/t_a/logcat.txt"])
    error = TestRecord("t.py::test_b[SM8650]", Outcome.ERROR, soc="SM8650", serial="R5CW1234ABC",
                       message="device gone", error_type="DeviceGone", error_kind=ErrorKind.INFRA,
                       attempts=[Attempt("R5CW0000", "DeviceGone: gone")])
    skipped = TestRecord("t.py::test_c[SM8650]", Outcome.SKIPPED, soc="SM8650", serial="R5CW1234ABC",
                         message="no QNN context binary for v79")
    passed = TestRecord("t.py::test_d[SM8650]", Outcome.PASSED, soc="SM8650", serial="R5CW1234ABC",
                        duration_s=1.25)
    unleased = TestRecord("t.py::test_e[SM8750]", Outcome.ERROR, soc="SM8750",
                          message="no device for SM8750 within 600s", error_kind=ErrorKind.INFRA)
    return [failed, error, skipped, passed, unleased]


def test_the_farms_junit_is_junit_10_but_for_each_testcases_properties_and_file(tmp_path):
    out = write_reports(_records(), tmp_path / "out", {"run_id": "r1",
                                                       "started_at": "2026-12-02T12:00:00+0000"})
    files = sorted((out / "junit").glob("*.xml"))
    assert [f.name for f in files] == ["R5CW1234ABC.xml", "unleased-SM8750.xml"]
    properties = {}
    for path in files:
        properties.update(valid_junit(path))
    assert properties["test_a[SM8650]"]["serial"] == "R5CW1234ABC"
    assert properties["test_a[SM8650]"]["soc"] == "SM8650"


@pytest.mark.parametrize(("document", "complaint"), [
    ('<testsuite name="s" tests="1" failures="0" errors="0"><testcase classname="c"/></testsuite>',
     "name"),  # a testcase without its name
    ('<testsuite name="s" tests="1" failures="1" errors="0"><failure message="m"/></testsuite>',
     "failure"),  # a failure outside any testcase
    ('<testsuite name="s" failures="0" errors="0"><testcase name="t"/></testsuite>', "tests"),
    ('<testsuite name="s" tests="1" failures="0" errors="0" time="1,5 s"><testcase name="t"/>'
     '</testsuite>', "time"),  # not a Surefire time
    ('<testsuite name="s" tests="1" failures="0" errors="0"><testcase name="t">'
     '<failure><properties/></failure></testcase></testsuite>', "properties"),
    ('<testsuite name="s" tests="1" failures="0" errors="0"><testcase name="t" line="3"/>'
     '</testsuite>', "line"),  # pytest xunit1's other attribute is not let through
])
def test_the_check_refuses_what_the_schema_refuses(tmp_path, document, complaint):
    path = tmp_path / "bad.xml"
    path.write_text(document)
    with pytest.raises(AssertionError, match=rf"bad\.xml: not valid JUnit \(junit-10\.xsd\): .*{complaint}"):
        valid_junit(path)
