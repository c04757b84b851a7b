"""The report directory of `farm qualify --out` / `pytest --farm-out` as a shared CI host treats it:
refused up front when it cannot take the reports, held by one run at a time, and a file system that
fills during the run costs neither a result nor the run's place in history."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time

import pytest

from farm.report.directory import lock_path
from farm.results.records import journal_paths
from farm.results.store import ResultsStore
from farm.virtual import VirtualDeviceSpec
from tests.report.test_out_dir import read_only
from tests.support.devices import make_qnn_bundle
from tests.support.plugin import REPO, explain, farm_toml, results_json, run_pytest


def _farm(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "farm.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=420)


def _one_line_bad_input(proc: subprocess.CompletedProcess, out) -> None:
    assert proc.returncode == 2, explain(proc)
    assert "Traceback" not in proc.stderr and "INTERNALERROR" not in proc.stdout + proc.stderr
    assert "+ pytest" not in proc.stderr  # refused before the run: nothing counted, started or leased
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"farm: error: report directory {out}") and line.endswith("[UsageError]")


def test_qualify_refuses_an_out_whose_parent_is_missing(tmp_path):
    out = tmp_path / "typo" / "out"
    proc = _farm("qualify", "--virtual", "SM8650", "--bundle", str(make_qnn_bundle(tmp_path / "b")),
                 "--out", str(out), cwd=tmp_path)
    _one_line_bad_input(proc, out)
    assert not (tmp_path / "typo").exists()


def test_qualify_refuses_a_read_only_out(tmp_path):
    bundle = make_qnn_bundle(tmp_path / "b")
    (tmp_path / "ro").mkdir()
    with read_only(tmp_path / "ro") as ro:
        proc = _farm("qualify", "--virtual", "SM8650", "--bundle", str(bundle), "--out", str(ro / "out"),
                     cwd=tmp_path)
    _one_line_bad_input(proc, ro / "out")


def test_the_plugin_refuses_a_read_only_out_as_a_usage_error(tmp_path):
    bundle = make_qnn_bundle(tmp_path / "b")
    (tmp_path / "t.py").write_text("def test_x(device):\n    pass\n")
    (tmp_path / "ro").mkdir()
    with read_only(tmp_path / "ro") as ro:
        proc = run_pytest(["t.py", "-p", "no:xdist", "--farm-virtual", "SM8650", "--farm-bundle",
                           str(bundle), "--farm-out", str(ro / "out"), "--farm-results-url", "none"],
                          cwd=tmp_path)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, explain(proc)
    assert "INTERNALERROR" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    assert f"ERROR: report directory {ro / 'out'}: cannot write in {ro}" in proc.stderr


WAITS = """
import os, pathlib, time

def test_waits_for_the_other_run(device):
    release = pathlib.Path(os.environ["RELEASE"])
    deadline = time.monotonic() + 300
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert release.exists()
"""


def test_a_second_run_on_the_same_out_is_refused_naming_the_first(virtual_farm, tmp_path):
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port,
                       f"sqlite:///{tmp_path / 'pool.db'}")
    bundle = make_qnn_bundle(tmp_path / "bundle")
    (tmp_path / "test_waits.py").write_text(WAITS)
    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--rootdir",
         str(tmp_path), "test_waits.py", "--farm-config", str(config), "--farm-bundle", str(bundle),
         "--farm-out", str(out), "--farm-results-url", "none"],
        cwd=tmp_path, env={**_env(), "RELEASE": str(tmp_path / "release")}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while "run " not in _read(lock_path(out)) and time.monotonic() < deadline:
            assert first.poll() is None, first.stdout.read()
            time.sleep(0.1)
        holder = _read(lock_path(out))
        assert f"pid {first.pid} on " in holder and ", run " in holder
        second = _farm("qualify", "--config", str(config), "--bundle", str(bundle), "--out", str(out),
                       cwd=tmp_path)
        _one_line_bad_input(second, out)
        assert f"in use by another run ({holder.strip()})" in second.stderr
    finally:
        (tmp_path / "release").touch()
        output, _ = first.communicate(timeout=300)
    assert first.returncode == 0, output
    [case] = results_json(out)["results"]  # the first run's report, whole and its own
    assert case["nodeid"] == "test_waits.py::test_waits_for_the_other_run[SM8650]"
    assert not lock_path(out).exists()


def _read(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_TESTRUNUID", None)
    return env


KILLED = """
import os, signal

def test_finished(device):
    pass

def test_killed(device):
    if os.environ.get("KILL"):
        os.kill(os.getpid(), signal.SIGKILL)  # the host dies mid-run: no report, no save
"""


def test_a_killed_runs_journal_outlives_the_next_run_and_is_recovered_apart(virtual_farm, tmp_path):
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    # The killed run's lease is reclaimed when its TTL runs out (nothing renews it): a short one, or
    # the next run waits the default 300 s for the device.
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port,
                       f"sqlite:///{tmp_path / 'pool.db'}", lease_ttl_s=6)
    (tmp_path / "test_killed.py").write_text(KILLED)
    out = tmp_path / "out"
    args = ["test_killed.py", "-p", "no:xdist", "--farm-config", str(config), "--farm-bundle",
            str(make_qnn_bundle(tmp_path / "bundle")), "--farm-out", str(out), "--farm-results-url", "none"]
    killed = run_pytest(args, cwd=tmp_path, env={"KILL": "1"})
    assert killed.returncode == -signal.SIGKILL and not out.exists()
    killed_run = _journal_run_id(out)
    again = run_pytest(args, cwd=tmp_path)
    assert again.returncode == 0, explain(again)
    assert f"a killed run's journal (run {killed_run})" in again.stdout
    second = results_json(out)
    assert [r["nodeid"] for r in second["results"]] == ["test_killed.py::test_finished[SM8650]",
                                                        "test_killed.py::test_killed[SM8650]"]
    proc = _farm("report", "recover", str(out), "--results-url", "none", cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    recovered = results_json(out.with_name(f"out.recovered-{killed_run}"))
    assert recovered["meta"]["run_id"] == killed_run != second["meta"]["run_id"]
    assert [r["nodeid"] for r in recovered["results"]] == ["test_killed.py::test_finished[SM8650]"]
    assert results_json(out) == second  # the second run's report is left as it was


def _journal_run_id(out) -> str:
    import json

    return json.loads(journal_paths(out)[1].read_text())["run_id"]


FILLS = """
import os, pathlib, pytest

@pytest.mark.parametrize("step", range(10))
def test_step(device, step):
    if step == 4:  # another job on the host fills the report directory's file system
        with open(pathlib.Path(os.environ["DISK"]) / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"x" * 65536)
                    f.flush()
            except OSError:
                pass
"""


def test_a_file_system_that_fills_mid_run_loses_no_result_and_not_the_run(virtual_farm, tmp_path):
    """A real full file system: the run goes in a user and mount namespace of its own with a small
    tmpfs as the report directory's parent, which a test fills halfway through the run."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True).returncode:
        pytest.skip("no user and mount namespaces here (unshare) to mount a small file system in")
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port,
                       f"sqlite:///{tmp_path / 'pool.db'}")
    (tmp_path / "test_fills.py").write_text(FILLS)
    disk, tmp = tmp_path / "disk", tmp_path / "tmp"
    disk.mkdir()
    tmp.mkdir()
    out, store_url = disk / "out", f"sqlite:///{tmp_path / 'results.db'}"
    mount = 'mount -t tmpfs -o size=24m ptefarm-test "$0" && exec "$@"'
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", mount, str(disk), sys.executable,
         "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--rootdir", str(tmp_path),
         "test_fills.py", "--farm-config", str(config), "--farm-bundle",
         str(make_qnn_bundle(tmp_path / "bundle")), "--farm-out", str(out),
         "--farm-results-url", store_url],
        cwd=tmp_path, env={**_env(), "DISK": str(disk), "TMPDIR": str(tmp)}, capture_output=True,
        text=True, timeout=600)
    # Every test passed; the report is not where it was asked for: infrastructure (3), never a
    # test failure, and no traceback.
    assert proc.returncode == 3, explain(proc)
    assert "Traceback" not in proc.stdout + proc.stderr and "INTERNALERROR" not in proc.stdout
    [fallback] = (tmp / "ptefarm-reports").iterdir()
    assert f"cannot write the report to {out}" in proc.stderr and f"written to {fallback}" in proc.stderr
    written = results_json(fallback)
    assert [r["outcome"] for r in written["results"]] == ["passed"] * 10
    with ResultsStore.open(store_url) as store:
        stored = store.load_run(written["meta"]["run_id"])
    assert len(stored.records) == 10 and stored.meta["verdict"] == "pass"
