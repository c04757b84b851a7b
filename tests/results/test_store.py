"""The results store (farm.results.store) on SQLite and PostgreSQL: a run reads back exactly as it was
saved, saving again replaces, a save is all or nothing, baselines pin runs against pruning, an older
pool database is migrated with its devices intact; results.json v2 and its reader."""

from __future__ import annotations

import json
import time

import pytest

from farm.config import from_dict
from farm.db.migrations import SCHEMA_VERSION
from farm.errors import UsageError
from farm.pool import Pool
from farm.pool.events import infra_events, last_event_id
from farm.report.directory import write_reports
from farm.results.jsonfile import load_results
from farm.results.records import Measurement
from farm.results.store import ResultsStore
from farm.vocab import Outcome
from tests.support.pool import fake_device
from tests.support.results import make_run


@pytest.fixture
def results(pool_url):
    with ResultsStore.open(pool_url) as store:
        yield store


def test_a_run_reads_back_exactly_as_saved(results):
    run = make_run()
    results.save_run(run)
    back = results.load_run(run.meta["run_id"])
    assert back == run
    assert json.dumps(back.meta) == json.dumps(run.meta)  # key order too
    assert back.records[0].measurements[0].values == [41.25, 40.5, 39.875]


def test_saving_again_replaces_the_run(results):
    run = make_run()
    results.save_run(run)
    run.meta["verdict"] = "pass"
    run.records = run.records[:1]
    run.records[0].measurements = [Measurement("tok_s", "tok/s", [7.0], "SmartMask", "kv", 64)]
    results.save_run(run)
    assert results.load_run(run.meta["run_id"]) == run
    [summary] = results.list_runs()
    assert (summary.verdict, summary.passed, summary.failed) == ("pass", 1, 0)


def test_an_unknown_run_is_named(results):
    results.save_run(make_run())
    with pytest.raises(UsageError, match=r"run 'nope' is not in the results store .*latest: 20250101"):
        results.load_run("nope")


@pytest.mark.parametrize("change, field", [
    (lambda r: r.meta.pop("run_id"), "meta.run_id"),
    (lambda r: r.meta.update(purpose="weekly"), "meta.purpose"),
    (lambda r: r.meta.update(verdict="meh"), "meta.verdict"),
    (lambda r: r.meta.update(started_at="yesterday"), "meta.started_at"),
    (lambda r: r.meta.update(bad=float("nan")), "meta: cannot be stored"),
    (lambda r: r.records[0].measurements[0].values.append(float("inf")), "not a finite number"),
])
def test_bad_runs_are_refused_naming_the_field(sqlite_pool_url, change, field):
    run = make_run()
    change(run)
    with ResultsStore.open(sqlite_pool_url) as results:
        with pytest.raises(UsageError, match=field):
            results.save_run(run)
        assert results.list_runs() == []


def test_an_interrupted_save_leaves_nothing_half_saved(results, monkeypatch):
    """Ctrl-C in the middle of saving (after the run row and some tests): the run is not there at all,
    and a run saved before under the same id is left whole."""
    from farm.db.base import Txn

    old = make_run()
    results.save_run(old)
    real_run = Txn.run
    calls = {"n": 0}

    def interrupted(self, sql, params=()):
        if sql.startswith("INSERT INTO test_results"):
            calls["n"] += 1
            if calls["n"] == 3:
                raise KeyboardInterrupt
        return real_run(self, sql, params)

    monkeypatch.setattr(Txn, "run", interrupted)
    new = make_run(run_id="20250102-000000-000002", started_at="2025-01-02T00:00:00+0000")
    with pytest.raises(KeyboardInterrupt):
        results.save_run(new)
    replacing = make_run(verdict="pass")
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        results.save_run(replacing)
    monkeypatch.setattr(Txn, "run", real_run)
    assert [s.run_id for s in results.list_runs()] == [old.meta["run_id"]]
    assert results.load_run(old.meta["run_id"]) == old


def test_history_lists_the_latest_first_with_counts_and_filters(results):
    results.save_run(make_run("r1", started_at="2025-01-01T00:00:00+0000", purpose="pr"))
    results.save_run(make_run("r2", started_at="2025-01-03T00:00:00+0000", purpose="release",
                              bundle="other"))
    results.save_run(make_run("r3", started_at="2025-01-02T00:00:00+0000", purpose="pr"))
    assert [s.run_id for s in results.list_runs()] == ["r2", "r3", "r1"]
    assert [s.run_id for s in results.list_runs(limit=1)] == ["r2"]
    assert [s.run_id for s in results.list_runs(purpose="pr")] == ["r3", "r1"]
    assert [s.run_id for s in results.list_runs(bundle="other")] == ["r2"]
    s = results.list_runs(limit=1)[0]
    assert (s.passed, s.failed, s.errors, s.skipped) == (1, 1, 2, 1)
    assert s.devices == ("SM8650 vdev-1", "SM8650 vdev-2")
    with pytest.raises(UsageError, match="purpose 'weekly'"):
        results.list_runs(purpose="weekly")


def test_baselines_name_runs_and_move(results):
    results.save_run(make_run("r1", started_at="2025-01-01T00:00:00+0000"))
    results.save_run(make_run("r2", started_at="2025-01-02T00:00:00+0000", bundle="other"))
    assert results.latest_baseline() is None
    assert results.set_baseline("v1.0", "r1", "me") is None
    assert results.baseline("v1.0") == results.load_run("r1")
    time.sleep(0.01)  # the pool clock orders the names
    results.set_baseline("v1.1", "r2")
    name, run = results.latest_baseline()
    assert (name.name, run.meta["run_id"]) == ("v1.1", "r2")
    assert results.latest_baseline("stories_110m")[0].name == "v1.0"
    assert results.latest_baseline("unknown") is None
    assert results.set_baseline("v1.0", "r2") == "r1"  # moved
    assert {b.name: b.run_id for b in results.baselines()} == {"v1.0": "r2", "v1.1": "r2"}
    assert results.list_runs(limit=1)[0].baselines == ("v1.0", "v1.1")


def test_baseline_errors_name_what_is_missing(results):
    results.save_run(make_run("r1"))
    with pytest.raises(UsageError, match="run 'r9' is not in the results store"):
        results.set_baseline("v1.0", "r9")
    with pytest.raises(UsageError, match="no baseline named 'v2' .*it has none"):
        results.baseline("v2")
    results.set_baseline("v1.0", "r1")
    with pytest.raises(UsageError, match="no baseline named 'v2' .*baselines: v1.0"):
        results.baseline("v2")
    with pytest.raises(UsageError, match="baseline name 'a b'"):
        results.set_baseline("a b", "r1")


def test_prune_keeps_recent_runs_and_every_baseline(results):
    now = time.time()

    def iso(days_ago: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(now - days_ago * 86400))

    results.save_run(make_run("old", started_at=iso(200)))
    results.save_run(make_run("old-pinned", started_at=iso(400)))
    results.save_run(make_run("recent", started_at=iso(10)))
    results.set_baseline("v0.9", "old-pinned")
    assert results.prune(180) == ["old"]
    assert sorted(s.run_id for s in results.list_runs()) == ["old-pinned", "recent"]
    with results.store.read() as txn:  # no orphan rows of the pruned run
        for table in ("test_results", "measurements"):
            assert txn.one(f"SELECT COUNT(*) AS n FROM {table} WHERE run_id = 'old'")["n"] == 0
    assert results.baseline("v0.9").meta["run_id"] == "old-pinned"
    with pytest.raises(UsageError, match="must be a finite number > 0"):
        results.prune(0)


def test_a_pool_of_the_previous_schema_is_migrated_keeping_its_devices(pool_url):
    with Pool.open(pool_url) as pool:
        pool.sync([fake_device("dev0")])
        with pool.store.write() as txn:  # back to schema 3: no results tables, no pool identity
            for table in ("baselines", "measurements", "test_results", "runs"):
                txn.run(f"DROP TABLE {table}")
            txn.run("ALTER TABLE pool_meta DROP COLUMN pool_id")
            for column in ("match_socs", "match_serial"):  # the queue's, added in 8
                txn.run(f"ALTER TABLE queue DROP COLUMN {column}")
            txn.run("UPDATE pool_meta SET schema_version = 3 WHERE id = 1")
        note = getattr(pool.store, "id_note", None)  # SQLite: schema 3 wrote no identity beside it
        if note is not None:
            note.unlink()
    with ResultsStore.open(pool_url) as results:
        results.save_run(make_run())
        assert results.load_run(make_run().meta["run_id"]) == make_run()
        with results.store.read() as txn:
            assert txn.one("SELECT schema_version FROM pool_meta")["schema_version"] == SCHEMA_VERSION
    with Pool.open(pool_url) as pool:
        assert [d.device.serial for d in pool.status().devices] == ["dev0"]


def test_infra_events_of_a_run_are_the_pools_after_its_start(pool):
    pool.sync([fake_device("dev0"), fake_device("dev1", soc="SM8550")])
    start = last_event_id(pool.store)
    pool.quarantine("dev0", "overheats")
    pool.quarantine("dev1", "not ours")
    events = infra_events(pool.store, start, ["SM8650"])
    assert [(e["serial"], e["kind"], e["reason"]) for e in events] == [("dev0", "quarantine",
                                                                        "overheats")]
    assert events[0]["at"].endswith("+00:00")
    assert infra_events(pool.store, last_event_id(pool.store), ["SM8650"]) == []


def test_results_retention_is_a_config_key():
    assert from_dict({}).results.retention_days == 180
    assert from_dict({"results": {"retention_days": 7}}).results.retention_days == 7
    with pytest.raises(UsageError, match="results.retention_days"):
        from_dict({"results": {"retention_days": -1}})
    with pytest.raises(UsageError, match="unknown key 'results.keep'"):
        from_dict({"results": {"keep": 1}})


# -- results.json ---------------------------------------------------------------------------------------

def test_results_json_v2_carries_versions_units_and_reads_back(tmp_path):
    run = make_run()
    out = write_reports(run.records, tmp_path / "out", run.meta)
    body = json.loads((out / "results.json").read_text())
    assert (body["format"], body["schema_version"]) == ("ptefarm-results/2", 2)
    assert body["tool_version"] == body["meta"]["tool_version"] == "0.1.0"
    assert body["generated_at"].endswith("+00:00")
    assert body["meta"]["units"] == {"tok_s": "tok/s", "duration_s": "s"}
    for key in ("bundle_digest", "verdict", "virtual", "devices", "manifest"):
        assert body["meta"][key] == run.meta[key]
    back = load_results(out)  # a report directory or its results.json
    assert back.records == run.records and back.meta["run_id"] == run.meta["run_id"]


def test_results_json_v1_still_loads(tmp_path):
    v1 = {"format": "ptefarm-results/1", "meta": {"run_id": "old", "verdict": "pass",
                                                  "manifest": "/gone/manifest.json"},
          "results": [{"nodeid": "t.py::test_a", "outcome": "passed", "soc": "SM8650",
                       "properties": {"tok_s_runs.SmartMask": "1.0 2.0"}}]}
    (tmp_path / "results.json").write_text(json.dumps(v1))
    run = load_results(tmp_path / "results.json")
    assert run.meta == v1["meta"]
    assert run.records[0].outcome == Outcome.PASSED and run.records[0].measurements == []


@pytest.mark.parametrize("text, problem", [
    ('{"format": "ptefarm-results/9", "meta": {}, "results": []}', "format 'ptefarm-results/9'"),
    ('[1, 2]', "format None"),
    ('{"format": "ptefarm-results/2", "meta": [], "results": []}', "field 'meta'"),
    ('{"format": "ptefarm-results/2", "meta": {}, "results": [{"nodeid": "x"}]}', r"results\[0\]"),
    ('{"format": "ptefarm-results/2", "meta": {}, "results": [{"nodeid": "x", "outcome": "meh"}]}',
     r"results\[0\]"),
    ("{not json", "not JSON"),
])
def test_a_bad_results_file_is_named(tmp_path, text, problem):
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=f"{path}: .*{problem}"):
        load_results(path)
    with pytest.raises(UsageError, match="no such results file"):
        load_results(tmp_path / "missing.json")


def test_history_of_some_runs_by_id(results):
    for run_id in ("r1", "r2", "r3"):
        results.save_run(make_run(run_id))
    assert sorted(s.run_id for s in results.list_runs(run_ids=["r3", "r1", "r9"])) == ["r1", "r3"]
    assert results.list_runs(run_ids=[]) == []


def test_the_default_baseline_has_the_runs_timing(results):
    """The newest named baseline of the bundle is a simulated run: a phone run's default baseline
    is the older measured one, never the simulated one (nor the other way round)."""
    measured, simulated = make_run("m1", started_at="2025-01-01T00:00:00+0000"), make_run("s1")
    for run, timing in ((measured, "measured"), (simulated, "simulated")):
        for r in run.records:
            for m in r.measurements:
                m.timing = timing
        results.save_run(run)
    results.set_baseline("phones", "m1")
    time.sleep(0.01)  # the pool clock orders the names
    results.set_baseline("sim", "s1")
    assert results.latest_baseline("stories_110m")[0].name == "sim"
    assert results.latest_baseline("stories_110m", timings=frozenset({"measured"}))[0].name == "phones"
    assert results.latest_baseline("stories_110m", timings=frozenset({"simulated"}))[0].name == "sim"
    assert results.latest_baseline("stories_110m", timings=frozenset({"host-cpu"})) is None
