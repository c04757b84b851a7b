"""``farm history``, ``farm baseline set|ls|show``, ``farm results prune`` on both backends, and a run of
the farm's throughput suite on virtual devices that lands in the results store with every measured
sample and the results.json v2 fields."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from farm.cli.main import main
from farm.results.jsonfile import load_results
from farm.results.store import ResultsStore
from tests.support.plugin import SUITES, explain, results_json, run_pytest
from tests.support.results import make_run


@pytest.fixture
def farm_cli(pool_url, tmp_path, monkeypatch):
    """``farm ARGS --url POOL`` in a clean environment: (exit code, stdout, stderr)."""
    monkeypatch.delenv("PTEFARM_CONFIG", raising=False)
    monkeypatch.setenv("PTEFARM_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(main, [*args, "--url", pool_url])
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, result.stdout, result.stderr

    return run


@pytest.fixture
def stored(pool_url):
    """Three runs: r1 (pr), r2 (release, another bundle), r3 (pr, the latest)."""
    with ResultsStore.open(pool_url) as store:
        store.save_run(make_run("r1", started_at="2025-01-01T00:00:00+0000", purpose="pr"))
        store.save_run(make_run("r2", started_at="2025-01-02T00:00:00+0000", purpose="release",
                                bundle="other", verdict="pass"))
        store.save_run(make_run("r3", started_at="2025-01-03T00:00:00+0000", purpose="pr"))
    return pool_url


def test_history_lists_runs_latest_first(farm_cli, stored):
    code, out, _ = farm_cli("history")
    assert code == 0
    assert out.index("r3") < out.index("r2") < out.index("r1")
    for text in ("stories_110m", "abababababab", "0123456789ab", "1 passed, 1 failed, 2 errors",
                 "2: SM8650 (virtual)", "release"):
        assert text in out
    code, out, _ = farm_cli("history", "--purpose", "pr", "--limit", "1", "--json")
    assert code == 0
    [row] = json.loads(out)
    assert (row["run_id"], row["passed"], row["errors"], row["devices"]) == \
        ("r3", 1, 2, ["SM8650 vdev-1", "SM8650 vdev-2"])
    code, out, _ = farm_cli("history", "--bundle", "other", "--json")
    assert [r["run_id"] for r in json.loads(out)] == ["r2"]
    code, out, _ = farm_cli("history", "--bundle", "nothing")
    assert code == 0 and "no runs in the results store" in out


def test_history_of_an_empty_store_and_bad_options(farm_cli):
    code, out, _ = farm_cli("history")
    assert code == 0 and "no runs" in out
    code, _, err = farm_cli("history", "--limit", "0")
    assert code == 2 and "--limit" in err
    code, _, err = farm_cli("history", "--purpose", "weekly")
    assert code == 2 and "weekly" in err


def test_baseline_set_ls_show(farm_cli, stored):
    code, out, _ = farm_cli("baseline", "set", "r1", "--name", "v1.0")
    assert code == 0 and "baseline v1.0: run r1" in out
    code, out, _ = farm_cli("baseline", "set", "r2", "--name", "v1.0")
    assert code == 0 and "(was run r1)" in out
    code, out, _ = farm_cli("baseline", "ls", "--json")
    [b] = json.loads(out)
    assert (b["name"], b["run_id"]) == ("v1.0", "r2") and "@" in b["created_by"]
    code, out, _ = farm_cli("baseline", "ls")
    assert code == 0 and "v1.0" in out and "other" in out
    code, out, _ = farm_cli("baseline", "show", "v1.0")
    assert code == 0
    assert "baseline v1.0: run r2" in out and "release run" in out
    assert "SmartMask" in out and "40.50" in out  # median of the stored samples
    code, out, _ = farm_cli("baseline", "show", "v1.0", "--json")
    shown = json.loads(out)
    assert shown["meta"]["run_id"] == "r2"
    assert shown["results"][0]["measurements"][0]["values"] == [41.25, 40.5, 39.875]
    code, out, _ = farm_cli("history", "--json")
    assert {r["run_id"]: r["baselines"] for r in json.loads(out)}["r2"] == ["v1.0"]


def test_unknown_runs_and_baselines_exit_2_with_their_name(farm_cli, stored):
    code, _, err = farm_cli("baseline", "set", "r404", "--name", "v1.0")
    assert code == 2 and "run 'r404' is not in the results store" in err
    code, _, err = farm_cli("baseline", "show", "v9")
    assert code == 2 and "no baseline named 'v9'" in err
    code, out, _ = farm_cli("baseline", "ls")
    assert code == 0 and "no baselines" in out


def test_results_prune_keeps_baselines(farm_cli, pool_url, tmp_path):
    def iso(days_ago: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(time.time() - days_ago * 86400))

    with ResultsStore.open(pool_url) as store:
        for run_id, age in (("ancient", 400), ("pinned", 300), ("old", 100), ("new", 1)):
            store.save_run(make_run(run_id, started_at=iso(age)))
        store.set_baseline("v0.1", "pinned")
    code, out, _ = farm_cli("results", "prune")  # the default: 180 days
    assert code == 0 and "pruned 1 run(s) older than 180 day(s): ancient" in out
    config = tmp_path / "farm.toml"
    config.write_text("[results]\nretention_days = 50\n")
    code, out, _ = farm_cli("results", "prune", "--config", str(config))
    assert code == 0 and "pruned 1 run(s) older than 50 day(s): old" in out
    code, out, _ = farm_cli("results", "prune", "--older-than", "0.5")
    assert code == 0 and ": new" in out
    code, out, _ = farm_cli("history", "--json")
    assert [r["run_id"] for r in json.loads(out)] == ["pinned"]
    code, _, err = farm_cli("results", "prune", "--older-than", "-1")
    assert code == 2 and "--older-than" in err


# -- a run of the suites lands in the store ---------------------------------------------------------------

THRESHOLDS = """warmup = 1
runs = 3
[ab]
min_blocks = 6
max_blocks = 6
[[min]]
soc = "*"
mode = "kv"
seq_len = 24
updater = "SmartMask"
tok_s = 1.0
[[relative]]
soc = "*"
mode = "kv"
seq_len = 24
faster = "SmartMask"
slower = "ShiftPointer"
max_slowdown_pct = 99
"""


def test_a_virtual_run_is_stored_with_every_sample(tiny_bundle, tmp_path):
    """The throughput suite on two virtual SM8650s under xdist (as farm qualify runs it), results to
    the pool database the config names (the run's own pool is private and gone at the end): the
    stored run equals results.json, with three samples per measured point, and history lists it."""
    (tmp_path / "th.toml").write_text(THRESHOLDS)
    db = f"sqlite:///{tmp_path / 'farm-pool.db'}"
    (tmp_path / "farm.toml").write_text(f'[pool]\nurl = "{db}"\n')
    out = tmp_path / "out"
    proc = run_pytest([str(SUITES / "test_throughput.py"), "-n", "2", "--farm-virtual", "SM8650:2",
                       "--farm-bundle", str(tiny_bundle), "--farm-thresholds", str(tmp_path / "th.toml"),
                       "--farm-out", str(out), "--farm-purpose", "nightly",
                       "--farm-config", str(tmp_path / "farm.toml")],
                      cwd=tmp_path, env={"PTEFARM_HOME": str(tmp_path / "home")})
    assert proc.returncode == 0, explain(proc)
    body = results_json(out)
    assert (body["format"], body["schema_version"]) == ("ptefarm-results/2", 2)
    meta = body["meta"]
    assert meta["purpose"] == "nightly" and meta["virtual"] is True and meta["verdict"] == "pass"
    assert meta["units"]["tok_s"] == "tok/s" and len(meta["bundle_digest"]) == 64
    assert meta["devices"] and all(d["soc"] == "SM8650" and d["android"] and d["model"] and d["virtual"]
                                   for d in meta["devices"])
    assert any(f["role"] == "pte" for f in meta["manifest"])
    assert all(len(f["sha256"]) == 64 and f["size"] > 0 for f in meta["manifest"])
    assert meta["infra_events"] == []

    with ResultsStore.open(db) as store:
        stored = store.load_run(meta["run_id"])
    assert stored == load_results(out)  # what the store has is what the report says
    by_point = {(r.name.partition("[")[0], m.updater): m for r in stored.records for m in r.measurements}
    assert set(by_point) == {("test_min_throughput", "SmartMask"),
                             ("test_relative_throughput", "SmartMask"),
                             ("test_relative_throughput", "ShiftPointer")}
    for (test, _), m in by_point.items():
        runs = 6 if test == "test_relative_throughput" else 3  # the A/B's blocks, the minimum's runs
        assert (m.metric, m.unit, m.mode, m.seq_len, len(m.values)) == ("tok_s", "tok/s", "kv", 24, runs)
        assert all(v > 0 for v in m.values)
    assert by_point["test_min_throughput", "SmartMask"].threshold == 1.0
    assert by_point["test_relative_throughput", "SmartMask"].threshold is None
    assert "results stored: run" in proc.stdout

    result = CliRunner().invoke(main, ["history", "--json", "--config", str(tmp_path / "farm.toml")])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    assert (row["run_id"], row["purpose"], row["passed"]) == (meta["run_id"], "nightly", 2)
    assert not (tmp_path / "home" / "pool.db").exists()  # not the farm home's default pool


def test_a_store_that_cannot_be_reached_costs_neither_report_nor_verdict(tiny_bundle, tmp_path):
    out = tmp_path / "out"
    proc = run_pytest([str(SUITES / "test_smoke.py"), "--farm-virtual", "SM8650", "--farm-bundle",
                       str(tiny_bundle), "--farm-out", str(out), "--farm-results-url",
                       "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"],
                      cwd=tmp_path, env={"PTEFARM_HOME": str(tmp_path / "home")})
    assert proc.returncode == 0, explain(proc)
    assert results_json(out)["meta"]["verdict"] == "pass"
    assert "infrastructure warning: run" in proc.stdout and "not saved to the results store" in \
        proc.stdout


def test_an_interrupted_run_is_stored_as_partial(tiny_bundle, tmp_path):
    """SIGINT mid-run: the report is partial and the store has the same partial run (the test that
    finished, the one cut off as an error), never a run without its tests."""
    (tmp_path / "test_slow.py").write_text(
        "import pytest, time\n"
        "@pytest.mark.parametrize('i', range(3))\n"
        "def test_slow(device, i):\n"
        "    if i == 1:\n"
        "        open('started', 'w').close()\n"
        "        time.sleep(120)\n")
    db = f"sqlite:///{tmp_path / 'results.db'}"
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir",
                             str(tmp_path), "test_slow.py", "--farm-virtual", "SM8650", "--farm-bundle",
                             str(tiny_bundle), "--farm-out", str(out), "--farm-results-url", db],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PTEFARM_HOME": str(tmp_path / "home")})
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    meta = results_json(out)["meta"]
    assert meta["partial"] is True
    with ResultsStore.open(db) as store:
        [summary] = store.list_runs()
        run = store.load_run(meta["run_id"])
    assert summary.partial and summary.verdict == "infra-error"
    assert run == load_results(out)
    outcomes = {r.name: r.outcome for r in run.records}
    assert outcomes == {"test_slow[SM8650-0]": "passed", "test_slow[SM8650-1]": "error"}
