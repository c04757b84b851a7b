#!/usr/bin/env python3
"""Publish a ``farm qualify`` report to GitHub Actions: annotations and the job summary.

    python ci/annotations.py REPORT_DIR [--exit-code N] [--root DIR] [--summary FILE] [--max N]

Reads the report back (``junit/*.xml``, and ``report.md`` or ``summary.md``) and prints, one line each,
GitHub's workflow commands:

- a failure of the code under test (JUnit ``<failure>``): ``::error file=F,line=L,title=Test failure: ...``
  on the test's file and line (the line of the traceback in that file, else the test function's);
- an infrastructure error (JUnit ``<error>`` "infrastructure: ..."): ``::warning`` titled
  "Infrastructure error (not a code failure)": the device, adb or pool kept the test from a verdict;
- bad input (JUnit ``<error>`` "bad input: ..."): ``::error`` titled "Bad input";
- a throughput regression found by the gate (exit 4): ``::error`` titled "Throughput regression",
  one per regressed point listed in report.md (inconclusive points as ``::warning``);
- no report at all (bad usage before any test, a crash): one annotation naming the exit code.

GitHub shows at most 10 error and 10 warning annotations per step: past ``--max`` of a kind, one
``::notice`` says how many more the report holds. When ``--summary FILE`` or ``$GITHUB_STEP_SUMMARY``
is set, the Markdown report (report.md, else summary.md) is appended to it.

Standard library only (xml.etree, no junitparser): it runs wherever Python 3.11 does, without the
farm's dev dependencies, and never changes the job's outcome: it exits 0 unless its own arguments are
wrong (2). The exit-code table below is farm.exitcodes' (a test keeps the two equal).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

# farm.exitcodes.ExitCode: code -> (name, meaning). A CI helper may depend on the farm, but this one is
# also run where the farm failed to install; tests/ci/test_workflows.py checks the two tables agree.
EXIT_CODES = {
    0: ("OK", "qualified: every test passed and no throughput regressed"),
    1: ("TEST_FAILURE", "the code under test failed"),
    2: ("BAD_INPUT", "bad usage or bad input (a flag, file, config key, SoC)"),
    3: ("INFRA", "infrastructure only: devices, adb, pool or timeouts kept tests from a verdict"),
    4: ("REGRESSION", "every test passed, but throughput regressed against the baseline"),
    130: ("INTERRUPTED", "interrupted before a verdict (the report is partial)"),
}
GITHUB_SUMMARY_LIMIT = 1024 * 1024  # GitHub refuses a step summary over 1 MiB
INFRA_TITLE = "Infrastructure error (not a code failure)"


@dataclass
class Annotation:
    level: str  # error, warning, notice
    title: str
    message: str
    file: str | None = None
    line: int | None = None

    def command(self) -> str:
        props = []
        if self.file:
            props.append(f"file={_escape_property(self.file)}")
            if self.line:
                props.append(f"line={self.line}")
        props.append(f"title={_escape_property(self.title)}")
        return f"::{self.level} {','.join(props)}::{_escape_data(self.message)}"


def _escape_data(text: str) -> str:
    """A workflow command's message (as @actions/core escapes it)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _locate(file: str, root: Path) -> str:
    """``file`` (relative to pytest's rootdir) as a path relative to the repository root, if found."""
    if not file or (root / file).is_file():
        return file
    candidate = root / "suites" / Path(file).name  # suites run from an installed ptefarm_suites
    return str(candidate.relative_to(root)) if candidate.is_file() else file


def _line(file: str, test_name: str, details: str, root: Path) -> int | None:
    """The line to annotate: the last traceback line in ``file``, else the test function's ``def``."""
    if file:
        hits = re.findall(rf"(?m)^{re.escape(file)}:(\d+):", details)
        if not hits:
            hits = re.findall(rf"(?m){re.escape(Path(file).name)}:(\d+):", details)
        if hits:
            return int(hits[-1])
    func = test_name.split("[", 1)[0]
    try:
        source = (root / file).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(rf"(?m)^\s*(?:async\s+)?def\s+{re.escape(func)}\s*\(", source)
    return source.count("\n", 0, m.start()) + 1 if m else None


def _tail(text: str, lines: int = 25, chars: int = 4000) -> str:
    kept = "\n".join(text.strip().splitlines()[-lines:])
    return kept if len(kept) <= chars else "…" + kept[-chars:]


def _props(element: ET.Element) -> dict[str, str]:
    found = element.find("properties")
    return {} if found is None else {p.get("name", ""): p.get("value", "") for p in found}


def junit_annotations(report: Path, root: Path) -> list[Annotation]:
    """One annotation per failed or errored test in ``report/junit/*.xml``."""
    out: list[Annotation] = []
    for path in sorted((report / "junit").glob("*.xml")):
        try:
            tree = ET.parse(path)
        except ET.ParseError as e:
            out.append(Annotation("warning", INFRA_TITLE, f"unreadable JUnit file {path.name}: {e}"))
            continue
        suites = [tree.getroot()] if tree.getroot().tag == "testsuite" else tree.getroot().iter("testsuite")
        for suite in suites:
            for case in suite.iter("testcase"):
                out += _case_annotations(case, root)
    return out


def _case_annotations(case: ET.Element, root: Path) -> list[Annotation]:
    name = case.get("name", "?")
    props = _props(case)
    where = ", ".join(x for x in (props.get("soc"), props.get("serial")) if x)
    label = f"{name} ({where})" if where else name
    file = _locate(case.get("file", ""), root)
    found = []
    for failure in case.findall("failure"):
        details = failure.text or ""
        message = failure.get("message", "") or "failed"
        body = message + (f"\n\n{_tail(details)}" if details.strip() else "")
        found.append(Annotation("error", f"Test failure: {label}", body, file,
                                _line(file, name, details, root)))
    for error in case.findall("error"):
        details = error.text or ""
        message = error.get("message", "") or "error"
        attempts = (case.findtext("system-err") or "").strip()
        body = message + (f"\n\nearlier attempts:\n{attempts}" if attempts else "")
        if message.startswith("bad input"):
            found.append(Annotation("error", f"Bad input: {label}", body, file,
                                    _line(file, name, details, root)))
        else:  # infrastructure (the plugin labels every other error so): not the code's fault
            found.append(Annotation("warning", f"{INFRA_TITLE}: {label}", body, file,
                                    _line(file, name, details, root)))
    return found


def _unmarkdown(text: str) -> str:
    return (text.replace("\\|", "|").replace("\\\\", "\\").replace("&lt;", "<").replace("&gt;", ">"))


def gate_annotations(report: Path) -> list[Annotation]:
    """The regression gate's regressed (error) and inconclusive (warning) points, from report.md."""
    try:
        text = (report / "report.md").read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for m in re.finditer(r"(?m)^- (regressed|inconclusive): (.+)$", text):
        if m.group(1) == "regressed":
            out.append(Annotation("error", "Throughput regression", _unmarkdown(m.group(2))))
        else:
            out.append(Annotation("warning", "Throughput inconclusive (more runs needed)",
                                  _unmarkdown(m.group(2))))
    return out


def annotations(report: Path, exit_code: int | None, root: Path) -> list[Annotation]:
    """Everything to annotate for the run that left ``report`` and ended with ``exit_code``."""
    name, meaning = EXIT_CODES.get(exit_code, ("UNKNOWN", "not a documented farm exit code")) \
        if exit_code is not None else ("", "")
    if not (report / "junit").is_dir() and not (report / "results.json").is_file():
        if exit_code in (None, 0):
            return []
        level = "warning" if exit_code == 3 else "error"
        return [Annotation(level, f"ptefarm: exit {exit_code} ({name})",
                           f"{meaning}; no report was written in {report} (see the job log)")]
    found = junit_annotations(report, root)
    gate = gate_annotations(report)
    if exit_code == 4 and not any(a.level == "error" for a in gate):
        gate.append(Annotation("error", "Throughput regression",
                               f"the regression gate failed; see {report / 'report.md'}"))
    found += gate
    if exit_code == 130:
        found.append(Annotation("warning", "ptefarm: interrupted", f"{meaning}: {report}"))
    elif exit_code not in (None, 0) and not found:
        found.append(Annotation("warning" if exit_code == 3 else "error",
                                f"ptefarm: exit {exit_code} ({name})", f"{meaning}; see {report}"))
    return found


def capped(found: list[Annotation], limit: int) -> list[Annotation]:
    """At most ``limit`` annotations of each level, then one notice counting the rest."""
    kept: list[Annotation] = []
    dropped: dict[str, int] = {}
    for a in found:
        if sum(k.level == a.level for k in kept) < limit:
            kept.append(a)
        else:
            dropped[a.level] = dropped.get(a.level, 0) + 1
    if dropped:
        more = ", ".join(f"{n} {level}{'s' if n > 1 else ''}" for level, n in sorted(dropped.items()))
        kept.append(Annotation("notice", "More in the report",
                               f"{more} not annotated (GitHub shows 10 per kind); see the report"))
    return kept


def summary_text(report: Path, exit_code: int | None) -> str:
    """The Markdown for the job summary: the report's own, or a line saying why there is none."""
    for name in ("report.md", "summary.md"):
        path = report / name
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            break
    else:
        label = EXIT_CODES.get(exit_code, ("UNKNOWN", "not a documented farm exit code"))
        text = (f"# ptefarm: no report\n\nExit code {exit_code} ({label[0]}): {label[1]}. "
                f"No report was written in `{report}`; see the job log.\n")
    budget = GITHUB_SUMMARY_LIMIT - 4096  # room for other steps' summaries
    if len(text.encode()) > budget:
        text = text.encode()[:budget].decode(errors="ignore")
        text = text[:text.rfind("\n") + 1] + f"\n… (cut: the whole report is `{report}/report.md`)\n"
    return text if text.endswith("\n") else text + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="the report directory farm qualify wrote (--out)")
    parser.add_argument("--exit-code", type=int, default=None, help="farm qualify's exit code")
    parser.add_argument("--root", type=Path, default=Path.cwd(),
                        help="repository root the annotations' file paths are relative to [default: .]")
    parser.add_argument("--summary", type=Path, default=None,
                        help="Markdown file to append the report to [default: $GITHUB_STEP_SUMMARY]")
    parser.add_argument("--max", type=int, default=10, help="annotations per kind [default: 10]")
    args = parser.parse_args(argv)
    for a in capped(annotations(args.report, args.exit_code, args.root.resolve()), args.max):
        print(a.command())
    summary = args.summary or (Path(os.environ["GITHUB_STEP_SUMMARY"])
                               if os.environ.get("GITHUB_STEP_SUMMARY") else None)
    if summary is not None:
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(summary_text(args.report, args.exit_code))
        except OSError as e:
            print(f"annotations: cannot append to the step summary {summary}: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
