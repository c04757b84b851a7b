"""``farm report merge``: shard runs (report directories or stored runs) into one group run, its report
directory written whole and the group stored once; shards stay out of history and baselines."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from farm.cli.main import main
from farm.errors import UsageError
from farm.exitcodes import ExitCode
from farm.report.directory import write_reports
from farm.results.store import ResultsStore
from tests.results.test_shards import items, shard_runs


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.delenv("PTEFARM_CONFIG", raising=False)
    monkeypatch.setenv("PTEFARM_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)

    def run(*args: str):
        result = CliRunner().invoke(main, list(args))
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, result.stdout, result.stderr

    return run


def shard_dirs(tmp_path, **kwargs) -> list[str]:
    dirs = []
    for s in shard_runs(2, **kwargs):
        out = tmp_path / s.source
        write_reports(s.run.records, out, s.run.meta)
        dirs.append(str(out))
    return dirs


def junit_cases(out) -> list[ET.Element]:
    return [c for f in sorted((out / "junit").glob("*.xml")) for c in ET.parse(f).getroot().iter("testcase")]


def test_two_shard_directories_merge_into_one_report_and_one_stored_run(cli, tmp_path, sqlite_pool_url):
    first, second = shard_dirs(tmp_path)
    code, out, err = cli("report", "merge", first, second, "--out", "release", "--results-url",
                         sqlite_pool_url, "--baseline", "none")
    assert code == ExitCode.OK, err
    release = tmp_path / "release"
    for name in ("report.html", "report.md", "summary.md", "results.json", "benchmark-v3.json"):
        assert (release / name).is_file(), name
    assert out.strip().splitlines()[-1].endswith("report.html")
    body = json.loads((release / "results.json").read_text())
    assert sorted(r["nodeid"] for r in body["results"]) == sorted(n for n, _ in items())
    assert body["meta"]["run_id"] == "group-ci-42" and body["meta"]["verdict"] == "pass"
    assert len(junit_cases(release)) == len(items())  # each test once over the per-device JUnit files
    assert "group ci-42: 1/2 run run-1 (pass); 2/2 run run-2 (pass)" in (release / "report.md").read_text()
    with ResultsStore.open(sqlite_pool_url) as store:
        [row] = store.list_runs()
        assert row.run_id == "group-ci-42" and row.passed == len(items())


def test_a_missing_shard_is_named_and_exits_3(cli, tmp_path):
    first, _ = shard_dirs(tmp_path)
    code, _, err = cli("report", "merge", first, "--out", "release", "--results-url", "none",
                       "--baseline", "none")
    assert code == ExitCode.INFRA, err
    assert "shard 2/2 of group ci-42 is MISSING" in err
    md = (tmp_path / "release" / "report.md").read_text()
    assert "2/2 MISSING" in md and "is missing" in md
    errors = [c for c in junit_cases(tmp_path / "release") if c.find("error") is not None]
    assert len(errors) == 6 and not [c for c in junit_cases(tmp_path / "release") if c.find("failure") is not None]


def test_shards_of_two_builds_are_refused_before_anything_is_written(cli, tmp_path):
    first, second = shard_dirs(tmp_path)
    path = tmp_path / second / "results.json"
    body = json.loads(path.read_text())
    body["meta"]["bundle_digest"] = "cd" * 32
    path.write_text(json.dumps(body))
    code, _, err = cli("report", "merge", first, second, "--out", "release", "--results-url", "none")
    assert code == ExitCode.BAD_INPUT
    assert "bundle_digest" in err and "not shards of one run" in err
    assert not (tmp_path / "release").exists()


def test_merge_by_group_takes_the_newest_stored_run_of_each_shard(cli, tmp_path, pool_url):
    first, second = shard_runs(2)
    older = shard_runs(2)[1]
    older.run.meta["run_id"] = "run-2-attempt-1"
    older.run.meta["started_at"] = "2026-12-03T09:00:00+0000"
    with ResultsStore.open(pool_url) as store:
        for s in (older, first, second):
            store.save_run(s.run)
        # shards are not whole runs: not in the history, and no baseline can name one
        assert store.list_runs() == []
        assert store.point_series(purpose="nightly") == []
        with pytest.raises(UsageError, match="is shard 1/2 of group ci-42"):
            store.set_baseline("v1", "run-1")
        assert {r.run_id for r in store.list_runs(group="ci-42")} == {"run-1", "run-2", "run-2-attempt-1"}
    code, _, err = cli("report", "merge", "--group", "ci-42", "--out", "release", "--results-url", pool_url,
                       "--config", str(_config(tmp_path, pool_url)), "--baseline", "none")
    assert code == ExitCode.OK, err
    assert "run run-2-attempt-1 left out, run run-2 is newer" in err
    with ResultsStore.open(pool_url) as store:
        assert [r.run_id for r in store.list_runs()] == ["group-ci-42"]
        assert store.set_baseline("v1", "group-ci-42") is None  # the merged run is a whole run


def test_merge_needs_shards(cli):
    code, _, err = cli("report", "merge")
    assert code == ExitCode.BAD_INPUT and "--group ID" in err


def _config(tmp_path, url):
    path = tmp_path / "farm.toml"
    path.write_text(f'[pool]\nurl = "{url}"\n')
    return path


@pytest.mark.parametrize("args, message", [
    (["--shard", "1/2"], "--shard needs a group id"),
    (["--shard", "3/2", "--group", "g1"], "K must be between 1 and N"),
    (["--shard", "1/2", "--group", "g 1"], "--group: 'g 1' must be"),
    (["--group", "g1"], "give --shard K/N"),
    (["--shard-by", "test"], "give --shard K/N"),
])
def test_qualify_refuses_a_bad_shard_before_any_export_or_device(cli, args, message):
    code, _, err = cli("qualify", "--virtual", "SM8650", *args)
    assert code == ExitCode.BAD_INPUT and message in err, err
    assert "exporting" not in err and "+ pytest" not in err
