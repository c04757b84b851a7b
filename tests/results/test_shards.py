"""Shards of one run (farm.results.shards) and their merge into one run (farm.results.group): the plan
is the same in every shard, a SoC's tests stay together, and the merge loses nothing: a missing shard or
a test its shard never reached is an infrastructure error in the merged run, never a pass."""

from __future__ import annotations

import random

import pytest

from farm.errors import UsageError
from farm.results.group import Shard, merge
from farm.results.records import QualificationResults, TestRecord
from farm.results.shards import group_meta, parse_shard, plan_shards
from farm.vocab import ErrorKind, Outcome, Verdict

SOCS = {"SM8650": 5, "SM8550": 3, "SM8750": 3, "SM8450": 1}


def items() -> list[tuple[str, str]]:
    out = [(f"suites/test_x.py::test_{i}[{soc}-p{i}]", soc) for soc, n in SOCS.items() for i in range(n)]
    return out + [("suites/test_bundle.py::test_manifest", "")]


def test_the_plan_is_the_same_whatever_the_collection_order():
    first = plan_shards(items(), 3)
    for seed in range(5):
        shuffled = items()
        random.Random(seed).shuffle(shuffled)
        assert plan_shards(shuffled, 3) == first


def test_by_soc_a_socs_tests_stay_in_one_shard_and_the_shards_are_balanced():
    plan = plan_shards(items(), 2)
    soc_of = dict(items())
    shards_of_soc = {soc: {i for i, ids in enumerate(plan) for n in ids if soc_of[n] == soc} for soc in SOCS}
    assert all(len(s) == 1 for s in shards_of_soc.values()), shards_of_soc
    # 5 + 1 + (the device-less test) against 3 + 3: greedy, largest SoC first
    assert sorted(len(ids) for ids in plan) == [6, 7]
    assert sorted(n for ids in plan for n in ids) == sorted(soc_of)  # every test once


def test_by_test_every_shard_gets_an_even_share():
    plan = plan_shards(items(), 4, "test")
    assert [len(ids) for ids in plan] == [4, 3, 3, 3]
    assert len({n for ids in plan for n in ids}) == 13


def test_more_shards_than_socs_leaves_shards_empty_by_soc():
    plan = plan_shards([("a[SM8650]", "SM8650"), ("b[SM8650]", "SM8650")], 2)
    assert plan == [["a[SM8650]", "b[SM8650]"], []]


@pytest.mark.parametrize("text, group, message", [
    ("0/2", "g1", "between 1 and N"), ("3/2", "g1", "between 1 and N"), ("2", "g1", "is not K/N"),
    ("a/b", "g1", "is not K/N"), ("1/2", None, "needs a group id"), ("1/2", "bad id", "--farm-group"),
])
def test_a_bad_shard_is_refused_with_the_flag_named(text, group, message):
    with pytest.raises(UsageError, match=message):
        parse_shard(text, group)


def test_a_bad_shard_by_is_refused():
    with pytest.raises(UsageError, match="--farm-shard-by"):
        parse_shard("1/2", "g1", "device")


# -- merging ----------------------------------------------------------------------------------------

def shard_runs(of: int = 2, *, group: str = "ci-42", drop: tuple[str, ...] = ()) -> list[Shard]:
    """One run per shard of items()' plan, every planned test passed (less ``drop``)."""
    collected = items()
    plan = plan_shards(collected, of)
    soc_of = dict(collected)
    runs = []
    for k in range(1, of + 1):
        spec = parse_shard(f"{k}/{of}", group)
        meta = {"run_id": f"run-{k}", "purpose": "nightly", "bundle_name": "tiny", "bundle_digest": "ab" * 32,
                "git_revision": "0123456789ab", "runner_dialect": "qnn", "verdict": "pass",
                "started_at": f"2026-12-03T10:0{k}:00+0000", "ended_at": f"2026-12-03T10:1{k}:00+0000",
                "socs": sorted({soc_of[n] for n in plan[k - 1] if soc_of[n]}), "virtual": True,
                "devices": [{"serial": f"v-{soc_of[n]}", "soc": soc_of[n]} for n in plan[k - 1][:1]],
                "group": group_meta(spec, plan, soc_of)}
        records = [TestRecord(n, Outcome.PASSED, soc=soc_of[n] or None, serial=f"v-{soc_of[n]}")
                   for n in plan[k - 1] if n not in drop]
        runs.append(Shard(f"reports/shard-{k}", QualificationResults(meta, records)))
    return runs


def test_merged_shards_hold_every_test_once_with_one_verdict():
    shards = shard_runs(2)
    merged = merge(list(reversed(shards)))
    assert sorted(r.nodeid for r in merged.run.records) == sorted(n for n, _ in items())
    assert merged.run.meta["verdict"] == Verdict.PASS.value and merged.missing == []
    assert merged.run.meta["run_id"] == "group-ci-42"
    assert merged.run.meta["started_at"] == "2026-12-03T10:01:00+0000"
    assert merged.run.meta["ended_at"] == "2026-12-03T10:12:00+0000"
    assert merged.run.meta["wall_s"] == pytest.approx(11 * 60)
    assert [s["run_id"] for s in merged.run.meta["group"]["shards"]] == ["run-1", "run-2"]
    assert set(merged.run.meta["socs"]) == set(SOCS)


def test_a_missing_shard_makes_its_tests_infrastructure_errors_under_their_socs():
    first, second = shard_runs(2)
    merged = merge([first])
    assert merged.missing == [2]
    lost = [r for r in merged.run.records if r.error_type == "ShardMissing"]
    assert {r.nodeid for r in lost} == set(second.run.meta["group"]["plan"][1])
    assert all(r.outcome == Outcome.ERROR and r.error_kind == ErrorKind.INFRA for r in lost)
    assert all("shard 2/2 of group ci-42 is missing" in r.message for r in lost)
    assert {r.soc for r in lost} == {"SM8550", "SM8750"}  # 3 + 3 against SM8650's 5 + 1 + 1
    assert merged.run.meta["verdict"] == Verdict.INFRA_ERROR.value  # never a pass


def test_a_test_its_shard_never_reached_is_an_infrastructure_error():
    victim = "suites/test_x.py::test_0[SM8650-p0]"
    merged = merge(shard_runs(2, drop=(victim,)))
    [lost] = [r for r in merged.run.records if r.nodeid == victim]
    assert lost.outcome == Outcome.ERROR and lost.error_kind == ErrorKind.INFRA and lost.soc == "SM8650"
    assert "ended before it" in lost.message and "reports/shard-" in lost.message
    assert merged.run.meta["verdict"] == Verdict.INFRA_ERROR.value
    assert sum(s["unfinished"] for s in merged.run.meta["group"]["shards"]) == 1


def test_a_failure_in_one_shard_fails_the_group():
    first, second = shard_runs(2)
    second.run.records[0].outcome = Outcome.FAILED
    assert merge([first, second]).run.meta["verdict"] == Verdict.FAIL.value


@pytest.mark.parametrize("spoil, message", [
    (lambda s: s.run.meta.update(bundle_digest="cd" * 32), "bundle_digest"),
    (lambda s: s.run.meta.update(git_revision="ffffffffffff"), "git_revision"),
    (lambda s: s.run.meta["group"].update(id="ci-43"), "group id"),
    (lambda s: s.run.meta["group"].update(plan_digest="0" * 16), "group plan_digest"),
    (lambda s: s.run.meta.pop("group"), "not a shard of a group run"),
])
def test_shards_of_different_runs_are_refused_naming_the_field(spoil, message):
    first, second = shard_runs(2)
    spoil(second)
    with pytest.raises(UsageError, match=message):
        merge([first, second])


def test_one_test_in_two_shards_is_refused():
    first, second = shard_runs(2)
    second.run.records.append(first.run.records[0])
    with pytest.raises(UsageError, match="has results in reports/shard-1 and in reports/shard-2|belongs to shard"):
        merge([first, second])


def test_a_shard_given_twice_is_refused_naming_both():
    first, _ = shard_runs(2)
    again = Shard("reports/shard-1-retry", first.run)
    with pytest.raises(UsageError, match="shard 1/2 given twice: reports/shard-1 .* and reports/shard-1-retry"):
        merge([first, again])
