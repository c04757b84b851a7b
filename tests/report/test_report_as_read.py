"""The qualification report as a person reads it: titles in words (no Python class name), a failed
test's device evidence folded into the page, only the plots that say something, the correctness table
in the order a reader wants (what did not pass first). The page is parsed (html.parser), not grepped."""

from __future__ import annotations

import ast
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from farm.report.html import render_html
from farm.report.markdown import render_markdown, summary_markdown
from farm.report.qualification import qualification_report
from farm.results.records import QualificationResults, TestRecord
from farm.vocab import ErrorKind, Outcome
from tests.report.test_html import _spread, _tput, sample_run

REPO = Path(__file__).resolve().parents[2]


# -- the page as a tree -------------------------------------------------------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None]):
        self.tag, self.attrs, self.children = tag, attrs, []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def find_all(self, tag: str) -> list[Node]:
        found = []
        for c in self.children:
            if isinstance(c, Node):
                if c.tag == tag:
                    found.append(c)
                found += c.find_all(tag)
        return found

    def find(self, tag: str) -> Node:
        [node] = self.find_all(tag)
        return node


class _Tree(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs))
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Node(tag, dict(attrs)))

    def handle_endtag(self, tag):
        if any(n.tag == tag for n in self.stack[1:]):
            while self.stack.pop().tag != tag:
                pass

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(page: str) -> Node:
    tree = _Tree()
    tree.feed(page)
    tree.close()
    return tree.root


def table_after(root: Node, heading_start: str) -> list[list[str]]:
    """The body rows (cell texts) of the first table after the h2 that starts with ``heading_start``."""
    seen = False

    def walk(node: Node):
        nonlocal seen
        for c in node.children:
            if not isinstance(c, Node):
                continue
            if c.tag == "h2" and c.text().startswith(heading_start):
                seen = True
            elif c.tag == "table" and seen:
                return c
            elif (found := walk(c)) is not None:
                return found
        return None

    table = walk(root)
    assert table is not None, f"no table after a heading {heading_start!r}"
    return [[td.text() for td in tr.find_all("td")] for tr in table.find("tbody").find_all("tr")]


def farm_class_names() -> set[str]:
    """Every CamelCase class name defined in farm/ (QualificationReport, TestRecord, ...)."""
    names = set()
    for path in (REPO / "farm").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and re.fullmatch(r"[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+", node.name):
                names.add(node.name)
    return names


def markdown_headings(text: str) -> list[str]:
    return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]


# -- 1. titles ----------------------------------------------------------------------------------------

def test_titles_and_headings_are_words_naming_the_bundle_and_the_verdict():
    names = farm_class_names()
    assert {"QualificationReport", "TestRecord", "QualificationResults"} <= names

    def class_names_in(text: str) -> set[str]:
        return set(re.findall(r"\w+", text)) & names

    q = qualification_report(sample_run(slow=0.8), sample_run(run_id="run-base"))
    page = parse(render_html(q))
    title = page.find("title").text()
    headings = [h.text() for tag in ("h1", "h2", "h3") for h in page.find_all(tag)]
    for text in (title, *headings):
        assert not class_names_in(text), text
    assert title == "Qualification of reference-tiny: FAIL"
    assert page.find("h1").text() == "Qualification of reference-tiny"

    md = render_markdown(q)
    for text in markdown_headings(md):
        assert not class_names_in(text), text
    assert md.splitlines()[0] == "# Qualification of reference-tiny: FAIL"

    run = sample_run()
    summary = summary_markdown(run.records, {**run.meta, "verdict": "fail"})
    for text in markdown_headings(summary):
        assert not class_names_in(text), text
    assert summary.splitlines()[0] == "# Qualification of reference-tiny: FAIL"


def test_a_partial_run_says_so_in_every_title():
    run = sample_run()
    run.meta["interrupted"] = True
    q = qualification_report(run)
    page = parse(render_html(q))
    assert page.find("title").text() == "Qualification of reference-tiny: INTERRUPTED (partial)"
    assert render_markdown(q).splitlines()[0] == "# Qualification of reference-tiny: INTERRUPTED (partial)"
    summary = summary_markdown(run.records, {**run.meta, "partial": True, "verdict": "fail"})
    assert summary.splitlines()[0] == "# Qualification of reference-tiny: FAIL (PARTIAL: the run was interrupted)"


# -- 2. evidence on the page --------------------------------------------------------------------------

FATAL = ("01-01 10:00:07.120  4242  4242 F libc    : Fatal signal 6 (SIGABRT), code -1 (SI_QUEUE) in tid "
         "4242 (farm-llama-runn), pid 4242 (farm-llama-runn)")
HOSTILE_LINE = "01-01 10:00:07.100  4242  4242 E QnnDsp  : bad graph <script>alert(1)</script> & <b>x</b>"


def _logcat(n_before: int = 400, n_after: int = 60) -> str:
    lines = [f"01-01 10:00:00.{i % 1000:03d}  1000  1000 I Unrelated: UNRELATED-FIRST-LINE-{i}"
             for i in range(n_before)]
    lines += [HOSTILE_LINE, FATAL]
    lines += [f"01-01 10:00:08.{i:03d}  1000  1000 I ActivityManager: after the crash {i}" for i in range(n_after)]
    return "\n".join(lines) + "\n"


TOMBSTONE = """*** *** *** *** *** *** *** *** *** *** *** *** *** *** *** ***
Build fingerprint: 'qcom/pineapple/pineapple:14/UKQ1/1:user/release-keys'
Revision: '0'
ABI: 'arm64'
Cmdline: /data/local/tmp/farm-llama-runner --model kv_llama.pte
pid: 4242, tid: 4242, name: farm-llama-runn  >>> /data/local/tmp/farm-llama-runner <<<
uid: 2000
signal 6 (SIGABRT), code -1 (SI_QUEUE), fault addr --------
Abort message: 'QnnHtp: graph execute failed <0x3ea>'
    x0  0000000000000000  x1  0000000000001092  x2  0000000000000006  x3  0000007fe4e1a6b0
    REGISTER-LINE-NOT-IN-SUMMARY
backtrace:
      #00 pc 000000000005b6b4  /apex/com.android.runtime/lib64/bionic/libc.so (abort+164)
      #01 pc 00000000000a1f20  /data/local/tmp/libQnnHtp.so (qnn_execute+88)
      #02 pc 0000000000012345  /data/local/tmp/farm-llama-runner (main+40)
"""

RUNNER = ("$ /data/local/tmp/farm-llama-runner --model kv_llama.pte --prompt 'Once'\nexit code: 134\n"
          "--- stdout ---\nSTDOUT-NOT-SHOWN\n--- stderr ---\n"
          + "".join(f"stderr line {i}\n" for i in range(100))
          + "E runner: failed to execute graph: QNN error 1002\n")


def _record(name: str, outcome: Outcome, evidence: list[str], **kw) -> TestRecord:
    return TestRecord(f"suites/test_smoke.py::{name}[SM8650]", outcome, "SM8650", "R5CW1234ABC",
                      message=f"{name} went wrong", evidence=evidence, **kw)


def _report_dir(tmp_path: Path, files: dict[str, bytes | str]) -> Path:
    out = tmp_path / "report"
    for rel, data in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return out


def _excerpts(root: Node, test_name: str) -> dict[str, Node]:
    """The folded excerpts in the row of ``test_name``, by the first word of their summary."""
    for tr in root.find_all("tr"):
        cells = tr.find_all("td")
        if any(td.text() == test_name for td in cells):
            return {d.find("summary").text().split()[0].rstrip(":"): d for d in tr.find_all("details")
                    if d.attrs.get("class") == "excerpt"}
    raise AssertionError(f"no row of {test_name}")


def test_a_failed_tests_evidence_is_folded_into_the_page_around_the_crash(tmp_path):
    ev = "evidence/suites_test_smoke.py_test_crashes_SM8650"
    files = {f"{ev}/logcat.txt": _logcat(), f"{ev}/tombstone_00": TOMBSTONE, f"{ev}/runner-1.txt": RUNNER,
             f"{ev}/battery.txt": "Current Battery Service state:\n"}
    out = _report_dir(tmp_path, files)
    record = _record("test_crashes", Outcome.FAILED, sorted(files))
    page_text = render_html(qualification_report(QualificationResults(
        {"run_id": "r1", "bundle_name": "tiny", "verdict": "fail"}, [record])), report_dir=out)
    page = parse(page_text)
    assert page.find_all("script") == []  # the logcat's markup is text, not markup
    found = _excerpts(page, "test_crashes[SM8650]")
    assert set(found) == {"logcat", "tombstone", "runner"}

    logcat = found["logcat"].find("pre").text()
    assert FATAL in logcat and HOSTILE_LINE in logcat  # the line with <script> reads as it was logged
    assert "UNRELATED-FIRST-LINE-0\n" not in logcat and "UNRELATED-FIRST-LINE-10\n" not in logcat
    assert "after the crash 0" in logcat
    assert len(logcat.splitlines()) < 60

    tombstone = found["tombstone"].find("pre").text()
    assert "signal 6 (SIGABRT)" in tombstone and "Abort message: 'QnnHtp: graph execute failed <0x3ea>'" in tombstone
    assert "#00 pc 000000000005b6b4" in tombstone and "pid: 4242" in tombstone
    assert "REGISTER-LINE-NOT-IN-SUMMARY" not in tombstone

    stderr = found["runner"].find("pre").text()
    assert stderr.splitlines()[-1] == "E runner: failed to execute graph: QNN error 1002"
    assert "STDOUT-NOT-SHOWN" not in stderr and "stderr line 0\n" not in stderr
    assert "exit code 134" in found["runner"].find("summary").text()

    # each excerpt links its whole file, relative to the report directory, and the file is there
    for kind, rel in (("logcat", f"{ev}/logcat.txt"), ("tombstone", f"{ev}/tombstone_00"),
                      ("runner", f"{ev}/runner-1.txt")):
        hrefs = [a.attrs["href"] for a in found[kind].find_all("a")]
        assert hrefs == [rel], (kind, hrefs)
        assert (out / hrefs[0]).is_file()
    # and the markdown points to the files
    md = render_markdown(qualification_report(QualificationResults({"run_id": "r1", "verdict": "fail"},
                                                                   [record])))
    assert f"- evidence of test_crashes[SM8650]: {ev}/battery.txt, {ev}/logcat.txt" in md


def test_an_errored_tests_logcat_without_a_crash_shows_its_last_lines(tmp_path):
    ev = "evidence/suites_test_smoke.py_test_times_out_SM8650"
    quiet = "".join(f"01-01 10:00:00.000  1000  1000 I Quiet   : quiet line {i}\n" for i in range(200))
    out = _report_dir(tmp_path, {f"{ev}/logcat.txt": quiet})
    record = _record("test_times_out", Outcome.ERROR, [f"{ev}/logcat.txt", f"{ev}/tombstone_01"],
                     error_kind=ErrorKind.INFRA)
    page = parse(render_html(qualification_report(QualificationResults(
        {"run_id": "r1", "bundle_name": "tiny", "verdict": "infra-error"}, [record])), report_dir=out))
    found = _excerpts(page, "test_times_out[SM8650]")
    logcat = found["logcat"].find("pre").text().splitlines()
    assert logcat[-1].endswith("quiet line 199") and len(logcat) == 40
    assert "last 40" in found["logcat"].find("summary").text()
    # the tombstone named in the record is not in the directory: said so, nothing made up
    assert "tombstone" not in found
    notes = [p.text() for p in page.find_all("p") if "not in the report directory" in p.text()]
    assert notes == ["not in the report directory: tombstone_01"]


def test_huge_undecodable_and_hostile_evidence_is_bounded_and_never_read_outside(tmp_path):
    ev = "evidence/t_SM8650"
    noise = b"".join(b"01-01 10:00:00.000  1000  1000 I Noise: \xff\xfe not utf-8 %d\n" % i for i in range(60_000))
    out = _report_dir(tmp_path, {f"{ev}/logcat.txt": noise + FATAL.encode() + b"\n" + noise[:5000]})
    (tmp_path / "logcat.txt").write_text(FATAL.replace("Fatal", "SECRET-OUTSIDE"))
    (tmp_path / "outside").write_text("SECRET-SYMLINKED " + FATAL)
    (out / ev / "tombstone_00").symlink_to(tmp_path / "outside")
    record = _record("test_huge", Outcome.FAILED, [f"{ev}/logcat.txt", "../logcat.txt", f"{ev}/tombstone_00",
                                                   "/etc/passwd"])
    assert (out / f"{ev}/logcat.txt").stat().st_size > 3 << 20
    page_text = render_html(qualification_report(QualificationResults(
        {"run_id": "r1", "bundle_name": "tiny", "verdict": "fail"}, [record])), report_dir=out)
    assert len(page_text) < 200_000
    assert "SECRET-OUTSIDE" not in page_text and "SECRET-SYMLINKED" not in page_text
    assert "root:" not in page_text
    found = _excerpts(parse(page_text), "test_huge[SM8650]")
    logcat = found["logcat"].find("pre").text()
    assert FATAL in logcat and "\ufffd" in logcat
    assert len(logcat) < 30_000


def test_without_the_report_directory_the_evidence_is_linked_not_excerpted():
    record = _record("test_crashes", Outcome.FAILED, ["evidence/x/logcat.txt"])
    page = parse(render_html(qualification_report(QualificationResults({"run_id": "r1"}, [record]))))
    assert [a.attrs["href"] for a in page.find_all("a")] == ["evidence/x/logcat.txt"]
    assert not [d for d in page.find_all("details") if d.attrs.get("class") == "excerpt"]


# -- 3. plots -----------------------------------------------------------------------------------------

def _plots_of(records: list[TestRecord]) -> set[str]:
    q = qualification_report(QualificationResults({"run_id": "r1", "bundle_name": "tiny"}, records))
    return {svg.attrs.get("aria-label") for svg in parse(render_html(q)).find_all("svg")}


def test_a_run_at_one_seq_len_has_no_seq_len_plot_and_one_at_two_has_it():
    one = [_tput(soc, soc.lower(), u, _spread(50.0), 64) for soc in ("SM8650", "SM8550")
           for u in ("SmartMask", "ShiftPointer")]
    assert _plots_of(one) == {"plot-by-soc"}  # no baseline either: no baseline-vs-now plot
    two = one + [_tput(soc, soc.lower(), u, _spread(40.0), 128) for soc in ("SM8650", "SM8550")
                 for u in ("SmartMask", "ShiftPointer")]
    assert _plots_of(two) == {"plot-by-soc", "plot-seq-len"}


def test_a_single_point_draws_no_plot_and_says_why():
    q = qualification_report(QualificationResults({"run_id": "r1"}, [_tput("SM8650", "s", "SmartMask",
                                                                            _spread(50.0))]))
    page = parse(render_html(q))
    assert page.find_all("svg") == []
    assert any(p.text().startswith("no plots:") for p in page.find_all("p"))


# -- 4. correctness order -----------------------------------------------------------------------------

def _correct(soc: str, case: str, outcome: Outcome = Outcome.PASSED, test: str = "test_updaters_agree",
             seq_len: str = "64", **kw) -> TestRecord:
    return TestRecord(f"suites/test_correctness.py::{test}[{soc}-kv-{case}-{seq_len}]", outcome, soc,
                      f"dev-{soc}", properties={"mode": "kv", "seq_len": seq_len},
                      message="" if outcome == Outcome.PASSED else f"{case} on {soc}: {outcome}", **kw)


@pytest.mark.parametrize("render", [render_html, render_markdown], ids=["html", "markdown"])
def test_the_correctness_table_lists_what_did_not_pass_first_then_by_soc_and_case(render):
    records = [_correct("SM8450", "story"), _correct("SM8650", "story", seq_len="128"),
               _correct("SM8550", "story", Outcome.ERROR, error_kind=ErrorKind.INFRA),
               _correct("SM8650", "hostile", Outcome.FAILED), _correct("SM8550", "hostile"),
               _correct("SM8450", "hostile"), _correct("SM8650", "story"),
               _correct("SM8650", "alpha", Outcome.SKIPPED), _correct("SM8450", "alpha"),
               _correct("SM8450", "alpha", test="test_matches_golden")]
    q = qualification_report(QualificationResults({"run_id": "r1", "bundle_name": "tiny"}, records))
    if render is render_html:
        rows = table_after(parse(render_html(q)), "Correctness")
    else:
        md = render_markdown(q).split("## Correctness", 1)[1].split("\n## ", 1)[0]
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines()
                if line.startswith("| SM")]
    got = [(soc, test, seq_len, case, outcome.split()[0]) for soc, test, _mode, seq_len, case, outcome, *_ in rows]
    assert got == [
        ("SM8650", "updaters_agree", "64", "hostile", "failed"),  # the last SoC's failure first
        ("SM8550", "updaters_agree", "64", "story", "error"),
        ("SM8650", "updaters_agree", "64", "alpha", "skipped"),
        ("SM8450", "matches_golden", "64", "alpha", "passed"),  # then by SoC, case, test, seq_len
        ("SM8450", "updaters_agree", "64", "alpha", "passed"),
        ("SM8450", "updaters_agree", "64", "hostile", "passed"),
        ("SM8450", "updaters_agree", "64", "story", "passed"),
        ("SM8550", "updaters_agree", "64", "hostile", "passed"),
        ("SM8650", "updaters_agree", "64", "story", "passed"),
        ("SM8650", "updaters_agree", "128", "story", "passed"),
    ]
