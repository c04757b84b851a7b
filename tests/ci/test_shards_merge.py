"""A qualification as shards of CI jobs (issue: past one host): two shard runs of ``ci/nightly.sh
--virtual`` merged by ``ci/merge.sh`` are one report with the content of a single run of the same
tests, and a shard whose report directory was lost is taken from the results store."""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET

from farm.exitcodes import ExitCode
from farm.results.store import ResultsStore
from tests.ci.test_workflows import CI_VARS
from tests.support.pool import REPO

SOCS = ("SM8650", "SM8550")
SUBSET = ("-k", "smoke or golden")


def _env(tmp_path, **extra: str) -> dict[str, str]:
    config = tmp_path / "farm.toml"
    config.write_text(f'[pool]\nurl = "sqlite:///{tmp_path / "results.db"}"\n')
    env = {k: v for k, v in os.environ.items() if k not in CI_VARS}
    return {**env, "PTEFARM_CONFIG": str(config), **extra}


def _run(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(REPO / "ci" / script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=420)
    return proc


def _content(report) -> dict:
    body = json.loads((report / "results.json").read_text())
    cases = sorted((c.get("classname"), c.get("name"), next((t.tag for t in c if t.tag in
                                                              ("failure", "error", "skipped")), "passed"))
                   for f in (report / "junit").glob("*.xml") for c in ET.parse(f).getroot().iter("testcase"))
    md = (report / "report.md").read_text()
    table = md[md.index("## SoC x suite"):md.index("\n\n", md.index("## SoC x suite") + 20)]
    return {"records": sorted((r["nodeid"], r["outcome"], r.get("soc"), r.get("message", ""))
                              for r in body["results"]),
            "junit": cases, "soc_x_suite": sorted(table.splitlines()),
            "verdict": body["meta"]["verdict"], "bundle": body["meta"]["bundle_digest"]}


def test_two_shards_of_the_nightly_merge_into_the_report_of_one_run(tmp_path, tiny_bundle):
    common = ("--virtual", *SOCS, "--bundle", str(tiny_bundle), "--baseline", "none")
    env = _env(tmp_path, GITHUB_RUN_ID="4242", GITHUB_RUN_ATTEMPT="1")
    single = _run("nightly.sh", *common, "--out", str(tmp_path / "single"), "--", *SUBSET,
                  env=_env(tmp_path))
    assert single.returncode == ExitCode.OK, single.stdout[-3000:] + single.stderr[-3000:]
    shards = []
    for k in (1, 2):
        proc = _run("nightly.sh", *common, "--shard", f"{k}/2", "--out", str(tmp_path / f"shard-{k}"),
                    "--", *SUBSET, env=env)
        assert proc.returncode == ExitCode.OK, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "--group 4242-1" in proc.stderr  # the CI run's id, by default
        shards.append(json.loads((tmp_path / f"shard-{k}" / "results.json").read_text()))
    # by SoC: each shard ran one SoC's tests, the shards together every test once
    socs = [{r["soc"] for r in s["results"]} for s in shards]
    assert sorted(map(sorted, socs)) == [["SM8550"], ["SM8650"]]

    merged = _run("merge.sh", "--out", str(tmp_path / "release"), "--group", "4242-1",
                  str(tmp_path / "shard-1"), str(tmp_path / "shard-2"), env=env)
    assert merged.returncode == ExitCode.OK, merged.stdout[-3000:] + merged.stderr[-3000:]
    assert merged.stdout.strip().splitlines()[-1] == str((tmp_path / "release" / "report.html").resolve())
    want, got = _content(tmp_path / "single"), _content(tmp_path / "release")
    assert got == want and len(want["records"]) >= 6
    assert "- shards: group 4242-1: 1/2 run" in (tmp_path / "release" / "report.md").read_text()

    # A lost artifact: shard 2's directory is gone, its stored run stands in for it.
    again = _run("merge.sh", "--out", str(tmp_path / "release-again"), "--group", "4242-1",
                 str(tmp_path / "shard-1"), env=env)
    assert again.returncode == ExitCode.OK, again.stderr[-3000:]
    assert f"from stored run {shards[1]['meta']['run_id']}" in again.stderr
    assert _content(tmp_path / "release-again") == want

    with ResultsStore.open(f"sqlite:///{tmp_path / 'results.db'}") as store:
        whole = {r.run_id for r in store.list_runs(limit=None)}  # the single run and the group, no shard
        assert whole == {single_id(tmp_path / "single"), "group-4242-1"}
        assert {r.shard for r in store.list_runs(limit=None, group="4242-1")} == {"", "1/2", "2/2"}


def single_id(report) -> str:
    return json.loads((report / "results.json").read_text())["meta"]["run_id"]
