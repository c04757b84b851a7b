"""``farm report recover``: a run killed before it wrote its report (SIGKILL) is turned into a report
from its journal, and saved to the results store as a finished run is, marked partial."""

from __future__ import annotations

import signal

from click.testing import CliRunner

from farm.cli.main import main
from farm.results.store import ResultsStore
from farm.virtual import VirtualDeviceSpec
from tests.support.devices import make_qnn_bundle
from tests.support.plugin import farm_toml, results_json, run_pytest

KILLED = """
import os, signal

def test_finished(device):
    assert device.shell("echo done", timeout=30).exit_code == 0

def test_killed(device):
    os.kill(os.getpid(), signal.SIGKILL)  # the host dies mid-run: no report, no save
"""


def _killed_run(virtual_farm, tmp_path):
    """The report directory of a run that was SIGKILLed after its first test finished."""
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port,
                       f"sqlite:///{tmp_path / 'pool.db'}")
    (tmp_path / "test_killed.py").write_text(KILLED)
    out = tmp_path / "out"
    proc = run_pytest(["test_killed.py", "-p", "no:xdist", "--farm-config", str(config),
                       "--farm-bundle", str(make_qnn_bundle(tmp_path / "bundle")),
                       "--farm-out", str(out), "--farm-results-url", "none"], cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL and not out.exists()
    return out


def _recover(*args: str):
    result = CliRunner().invoke(main, ["report", "recover", *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def test_a_recovered_run_is_reported_and_stored_partial(virtual_farm, pool_url, tmp_path):
    out = _killed_run(virtual_farm, tmp_path)
    result = _recover(str(out), "--results-url", pool_url)
    assert result.exit_code == 0, result.output
    assert "results stored" in result.stdout
    written = results_json(out)
    assert written["meta"]["partial"] is True
    run_id = written["meta"]["run_id"]
    with ResultsStore.open(pool_url) as store:
        [summary] = store.list_runs()
        stored = store.load_run(run_id)
    assert summary.run_id == run_id and stored.meta["partial"] is True
    assert [r.nodeid for r in stored.records] == ["test_killed.py::test_finished[SM8650]"]
    assert stored.meta["verdict"] == written["meta"]["verdict"]


def test_a_store_that_is_down_costs_the_save_not_the_report(virtual_farm, tmp_path):
    out = _killed_run(virtual_farm, tmp_path)
    # Nothing listens on port 9: the database is down.
    result = _recover(str(out), "--results-url", "postgresql://nobody@127.0.0.1:9/none")
    assert result.exit_code == 3, result.output
    assert "not saved to the results store" in result.stderr
    assert results_json(out)["meta"]["partial"] is True  # the report is written all the same
