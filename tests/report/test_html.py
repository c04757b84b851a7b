"""The release qualification report: HTML (rendered in headless Chromium through the DevTools
protocol: no console error, no request leaving the page, a screenshot kept), Markdown, the CLI, and
infrastructure errors shown as errors everywhere."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.report.html import render_html
from farm.report.markdown import render_markdown
from farm.report.qualification import qualification_report
from farm.results.records import Attempt, Measurement, QualificationResults, TestRecord
from farm.vocab import ErrorKind, Outcome
from tests.support.plugin import explain

CHROMIUM = shutil.which("chromium")
SCREENSHOT_DIR_ENV = "PTEFARM_SCREENSHOT_DIR"  # set it to keep screenshots beyond the test's tmp dir
HOSTILE = "Say \"hi\" $(reboot) `id`; echo '<|eot_id|>' <script>alert(1)</script> & <b>bold</b>"


# -- a run to report ----------------------------------------------------------------------------------

def _tput(soc: str, serial: str, updater: str, values: list[float], seq_len: int = 64) -> TestRecord:
    return TestRecord(f"suites/test_throughput.py::test_min_throughput[{soc}-kv-{seq_len}-{updater}]",
                      Outcome.PASSED, soc, serial, duration_s=1.5,
                      properties={"mode": "kv", "seq_len": str(seq_len), "updater": updater,
                                  "timing": "host-cpu"},
                      measurements=[Measurement("tok_s", "tok/s", values, updater, "kv", seq_len, 20.0,
                                                timing="host-cpu")])  # the sample's devices are virtual


def _spread(center: float, n: int = 6) -> list[float]:
    return [center + d for d in (-1.5, -0.5, 0.0, 0.4, 1.1, 1.8)[:n]]


def sample_run(*, slow: float = 1.0, run_id: str = "run-now") -> QualificationResults:
    """Two SoCs, both updaters, a correctness failure with a hostile prompt, an infrastructure error."""
    records = []
    for soc, serial, speed in (("SM8650", "emu-8650", 100.0), ("SM8550", "emu-8550", 70.0)):
        for updater in ("SmartMask", "ShiftPointer"):
            for seq_len in (64, 128):
                factor = slow if (soc, updater) == ("SM8650", "SmartMask") else 1.0
                records.append(_tput(soc, serial, updater, _spread(speed * factor * 64 / seq_len), seq_len))
        records.append(TestRecord(f"suites/test_correctness.py::test_updaters_agree[{soc}-kv-story]",
                                  Outcome.PASSED, soc, serial, properties={"mode": "kv", "seq_len": "64"}))
    records.append(TestRecord(
        "suites/test_correctness.py::test_updaters_agree[SM8650-kv-hostile]", Outcome.FAILED, "SM8650",
        "emu-8650", properties={"mode": "kv", "seq_len": "64"}, error_type="Failed",
        message=f"SmartMask and ShiftPointer diverge at token ids index 3 on emu-8650 (kv): {HOSTILE}",
        details=f"continuations:\n  SmartMask: {HOSTILE!r}"))
    records.append(TestRecord(
        "suites/test_smoke.py::test_device_answers[SM8550]", Outcome.ERROR, "SM8550", "emu-8550",
        message="DeviceGone: emu-8550 vanished", error_kind=ErrorKind.INFRA, error_type="DeviceGone",
        attempts=[Attempt("emu-8550b", "DeviceTimeout: hung")]))
    meta = {"run_id": run_id, "purpose": "release", "git_revision": "abc123", "bundle_name": "reference-tiny",
            "bundle_digest": "f" * 64, "runner_dialect": "host", "started_at": "2025-01-01T10:00:00+0000",
            "ended_at": "2025-01-01T10:05:00+0000", "wall_s": 300.0, "virtual": True, "tool_version": "0.1.0",
            "devices": [{"serial": "emu-8650", "soc": "SM8650", "model": "Virtual SM8650", "android": "14",
                         "htp_arch": "v75", "virtual": True},
                        {"serial": "emu-8550", "soc": "SM8550", "model": "Virtual SM8550", "android": "13",
                         "htp_arch": "v73", "virtual": True}],
            "manifest": [{"name": "kv_llama.pte", "sha256": "a" * 64, "size": 1234, "role": "model"},
                         {"name": "tokenizer.model", "sha256": "b" * 64, "size": 99, "role": "tokenizer"}],
            "infra_events": [{"at": "2025-01-01T10:02:00+0000", "serial": "emu-8550", "kind": "quarantine",
                              "reason": "3 infrastructure errors in a row"}]}
    return QualificationResults(meta, records)


def write_results(run: QualificationResults, out: Path) -> Path:
    """A report directory as farm qualify leaves it (results.json, v1 layout)."""
    out.mkdir(parents=True)
    body = {"format": "ptefarm-results/1", "meta": run.meta, "results": [r.to_json() for r in run.records]}
    (out / "results.json").write_text(json.dumps(body))
    return out


# -- headless Chromium through the DevTools protocol -------------------------------------------------

class DevTools:
    """Chromium's DevTools protocol over --remote-debugging-pipe (fd 3 in, fd 4 out, NUL-separated
    JSON): the console, exceptions, log entries and network requests of a page, seen by the browser
    itself rather than by a hook the page would have to carry."""

    def __init__(self, profile: Path):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        def child_fds() -> None:  # the child sees our pipe ends as fds 3 and 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", "--hide-scrollbars", "--window-size=1280,900", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=child_fds,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._from_chrome], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("chromium did not answer")  # a hang guard, not an assertion on time
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                del self.events[i]
                return ev
        while True:
            ev = self._read(deadline)
            if ev.get("method") == method:
                return ev
            self.events.append(ev)

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


def render_in_chromium(page: Path, screenshot: Path, workdir: Path) -> tuple[list[str], list[str]]:
    """Load ``page`` in headless Chromium; (console errors and exceptions, URLs requested that are not
    the page itself). Saves a full-page screenshot to ``screenshot``."""
    devtools = DevTools(workdir / "chromium-profile")
    try:
        target = devtools.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = devtools.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            devtools.call(f"{domain}.enable", session=session)
        devtools.call("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        devtools.wait_event("Page.loadEventFired")
        devtools.call("Runtime.evaluate", {"expression": "document.readyState"}, session=session)
        shot = devtools.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                             session=session)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        events = list(devtools.events)
    finally:
        devtools.close()
    errors, fetched = [], []
    for ev in events:
        method, params = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
            errors.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            errors.append(f"exception: {details.get('text')} "
                          f"{details.get('exception', {}).get('description', '')}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
            errors.append(f"log: {params['entry'].get('text')}")
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            if url != page.resolve().as_uri():
                fetched.append(url)
    return errors, fetched


def keep_screenshot(path: Path) -> None:
    if os.environ.get(SCREENSHOT_DIR_ENV):
        dest = Path(os.environ[SCREENSHOT_DIR_ENV])
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, dest / path.name)


# ci/test.sh installs chromium; under CI a missing browser is a failure, not a silent skip.
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                                    reason="Debian's chromium is not installed")


# -- tests --------------------------------------------------------------------------------------------

@needs_chromium
def test_report_renders_in_chromium_without_console_errors(tmp_path):
    q = qualification_report(sample_run(slow=0.8), sample_run(run_id="run-base"))
    page = tmp_path / "report.html"
    page.write_text(render_html(q))
    shot = tmp_path / "report.png"
    errors, fetched = render_in_chromium(page, shot, tmp_path)
    assert errors == [] and fetched == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    keep_screenshot(shot)


@needs_chromium
def test_the_chromium_check_sees_console_errors_and_fetches(tmp_path):
    """The check above can fail: a page with a script error, a console.error and an external image is
    caught by the browser's own reports (nothing in the page hooks them)."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><img src='http://192.0.2.1/x.png'>"
                    "<script>console.error('boom'); undefinedFunction();</script></body></html>")
    errors, fetched = render_in_chromium(page, tmp_path / "bad.png", tmp_path)
    assert any("boom" in e for e in errors) and any("undefinedFunction" in e for e in errors)
    assert fetched == ["http://192.0.2.1/x.png"]


def test_html_is_self_contained_and_escapes_data():
    text = render_html(qualification_report(sample_run(slow=0.8), sample_run(run_id="run-base")))
    assert "<script" not in text.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&lt;b&gt;bold&lt;/b&gt;" in text and "<b>bold</b>" not in text
    for attr in ("src=", "href=\"http", "@import", "url(http"):
        assert attr not in text
    assert text.count("<svg") == 3  # by SoC, against seq_len, baseline vs now


def test_every_soc_and_both_updaters_appear_in_html_and_markdown():
    q = qualification_report(sample_run(slow=0.8), sample_run(run_id="run-base"))
    for text in (render_html(q), render_markdown(q)):
        for needle in ("SM8650", "SM8550", "SmartMask", "ShiftPointer", "Virtual SM8650", "kv_llama.pte",
                       "a" * 16, "quarantine", "DeviceTimeout: hung", "token 3", "hostile"):
            assert needle in text, needle


def test_verdict_comes_first_and_a_slowed_point_regresses():
    q = qualification_report(sample_run(slow=0.8), sample_run(run_id="run-base"))
    md = render_markdown(q)
    assert md.startswith("# Qualification of reference-tiny: FAIL")  # the correctness failure wins
    by = {(p.key.soc, p.key.updater, p.key.seq_len): p.verdict for p in q.gate.points}
    assert by[("SM8650", "SmartMask", 64)] == "regressed"
    assert by[("SM8550", "ShiftPointer", 64)] == "unchanged"
    html_text = render_html(q)
    assert html_text.index('id="verdict"') < html_text.index("SoC x suite")


def test_an_infra_error_is_an_error_never_a_failure():
    run = sample_run()
    run.records = [r for r in run.records if r.outcome != Outcome.FAILED]  # only the infra error left
    q = qualification_report(run, sample_run(run_id="run-base"))
    md = render_markdown(q)
    assert md.startswith("# Qualification of reference-tiny: INFRA ERROR")
    assert "## Failures" not in md and "## Errors (no verdict" in md
    assert "| test_device_answers[SM8550] | infrastructure error |" in md
    html_text = render_html(q)
    assert "Failures (the code under test)" not in html_text
    assert "error (infrastructure)" in html_text and ">INFRA ERROR<" in html_text


def test_a_run_without_baseline_says_so():
    q = qualification_report(sample_run(), None)
    assert q.gate.verdict == "no-baseline"
    assert "no baseline" in render_markdown(q)
    assert render_html(q).count("<svg") == 2  # no baseline-vs-now plot


# -- farm report ----------------------------------------------------------------------------------------

def _farm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PTEFARM_HOME": str(cwd / "farm-home")}  # a results store of its own, if any
    env.pop("PTEFARM_CONFIG", None)
    return subprocess.run([sys.executable, "-P", "-m", "farm.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=env)


def test_farm_report_compare_writes_html_and_markdown_and_exits_with_the_gate(tmp_path):
    run = sample_run(slow=0.8)
    run.records = [r for r in run.records if r.outcome == Outcome.PASSED]  # tests pass; the gate fails
    now = write_results(run, tmp_path / "now")
    base = write_results(sample_run(run_id="run-base"), tmp_path / "base")
    proc = _farm("report", str(now), "--compare", str(base / "results.json"), "--out", str(tmp_path / "r"),
                 cwd=tmp_path)
    assert proc.returncode == 4, explain(proc)
    assert proc.stdout.strip().splitlines()[-1] == str(tmp_path / "r" / "report.html")
    assert (tmp_path / "r" / "report.md").read_text().startswith("# Qualification of reference-tiny: REGRESSION")
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["report.html", "report.md"]
    # Without --out the report goes beside the run's results.
    proc = _farm("report", str(now), "--min-effect", "50", "--compare", str(base), cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert (now / "report.html").is_file()


@pytest.mark.parametrize("args,needle", [
    (["missing-dir/results.json"], "missing-dir/results.json"),
    (["20250101-000000-000000"], "20250101-000000-000000"),
    (["NOW", "--compare", "nope"], "nope"),
    (["NOW", "--min-effect", "abc"], "--min-effect"),
    (["NOW", "--format", "pdf"], "pdf"),
])
def test_farm_report_bad_input_is_exit_2(args, needle, tmp_path):
    now = write_results(sample_run(), tmp_path / "now")
    proc = _farm("report", *[str(now) if a == "NOW" else a for a in args], cwd=tmp_path)
    assert proc.returncode == 2, explain(proc)
    assert needle in proc.stderr


def test_farm_report_names_the_bad_field(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text(json.dumps(
        {"format": "ptefarm-results/1", "meta": {}, "results": [{"nodeid": "x"}]}))
    proc = _farm("report", str(tmp_path / "bad"), cwd=tmp_path)
    assert proc.returncode == 2, explain(proc)
    assert "results[0]" in proc.stderr and "results.json" in proc.stderr


def test_an_interrupted_write_leaves_no_half_report(tmp_path, monkeypatch):
    from farm.cli import report as report_cli

    real_replace = os.replace

    def interrupted(src, dst):
        if str(dst).endswith("report.html"):
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report_cli.write_outputs(sample_run(), None, tmp_path / "r", ("markdown", "html"))
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["report.md"]  # whole, or absent


def test_every_figure_says_where_it_comes_from():
    """A simulated phone's figures beside a phone's, in one run: report.md's and report.html's
    throughput rows, the plots' titles and summary.md each say SIMULATED beside the simulated ones,
    and the measured ones read as measured."""
    from farm.report.markdown import summary_markdown

    run = sample_run()
    for r in run.records:
        timing = "simulated" if r.soc == "SM8650" else "measured"
        r.properties["timing"] = timing
        for m in r.measurements:
            m.timing = timing
            r.properties[f"tok_s.{m.updater}"] = f"{m.values[0]:.2f}"  # as the throughput suite sets it
    q = qualification_report(run, None)
    md = render_markdown(q)
    rows = [line for line in md.splitlines() if line.startswith("| SM8") and "tok/s" in line]
    assert rows and all(("| SIMULATED |" in line) == line.startswith("| SM8650") for line in rows), rows
    assert all("| measured |" in line for line in rows if line.startswith("| SM8550"))
    html = render_html(q)
    assert '<td class="not-measured">SIMULATED</td>' in html
    assert "figures: SIMULATED, measured" in html  # the plot titles
    summary = summary_markdown(run.records, run.meta)
    assert "- figures: SIMULATED (phone model, not measured), measured (phone)" in summary
    sim = [line for line in summary.splitlines() if "test_min_throughput[SM8650" in line]
    assert sim and all("(SIMULATED)" in line for line in sim), sim
    assert not [line for line in summary.splitlines() if "test_min_throughput[SM8550" in line
                and "SIMULATED" in line]


def test_a_timing_value_that_is_none_of_ours_reads_as_unknown_never_as_measured():
    from farm.report.markdown import summary_markdown

    run = sample_run()
    for r in run.records:
        r.properties["timing"] = "host CPU"  # a label where a value belongs: a suite's own slip
    assert "- figures: timing unknown" in summary_markdown(run.records, run.meta)
