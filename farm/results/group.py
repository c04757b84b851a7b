"""One run from the shards of a group (farm.results.shards): ``farm report merge``.

The shards must be parts of one run: the same group id, shard count, plan, bundle, revision and
purpose, each shard once, no test in two shards. The merged run holds every shard's records, and for
every test of the plan that has none (its shard is missing, or its shard's run ended before it), an
infrastructure error saying so: a lost shard never reads as a pass, and is never blamed on the bundle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from farm.errors import UsageError
from farm.results.records import (
    ErrorKind,
    Outcome,
    QualificationResults,
    TestRecord,
    verdict,
)

# What every shard of one run has the same of (a shard of another build is not part of this one).
SAME = ("bundle_digest", "bundle_name", "git_revision", "purpose", "runner_dialect")


@dataclass
class Shard:
    source: str  # where it came from (a report directory, a results.json, a stored run id): for messages
    run: QualificationResults

    @property
    def group(self) -> dict[str, Any]:
        return self.run.meta["group"]

    @property
    def index(self) -> int:
        return int(self.group["shard"])


@dataclass
class Merged:
    run: QualificationResults
    present: list[int]
    missing: list[int]
    # shard -> tests of its plan it has no result for (it ended before them)
    unfinished: dict[int, list[str]] = field(default_factory=dict)


def group_of(run: QualificationResults, source: str) -> dict[str, Any]:
    """The run's ``meta.group``, checked; a UsageError naming the source if it is not a shard's."""
    group = run.meta.get("group")
    if not isinstance(group, dict) or "plan" not in group:
        raise UsageError(f"{source}: run {run.meta.get('run_id', '?')} is not a shard of a group run "
                         f"(no meta.group with a plan: it ran without --farm-shard)")
    try:
        index, of = int(group["shard"]), int(group["of"])
        plan = [list(map(str, ids)) for ids in group["plan"]]
        str(group["id"])
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{source}: meta.group is malformed: {e}") from None
    if not 1 <= index <= of or len(plan) != of:
        raise UsageError(f"{source}: meta.group: shard {index}/{of} with a plan of {len(plan)} shard(s)")
    return group


def merge(shards: Sequence[Shard]) -> Merged:
    """The group's run from its shards (in any order). UsageError, naming the sources, when they are not
    parts of one run."""
    if not shards:
        raise UsageError("merge: no shard runs given")
    for s in shards:
        group_of(s.run, s.source)
    shards = sorted(shards, key=lambda s: s.index)
    for a, b in zip(shards, shards[1:]):
        if a.index == b.index:
            raise UsageError(f"shard {a.index}/{a.group['of']} given twice: {a.source} (run "
                             f"{a.run.meta.get('run_id', '?')}) and {b.source} (run "
                             f"{b.run.meta.get('run_id', '?')}); give the one to keep")
    first = shards[0]
    for s in shards[1:]:
        for key in ("id", "of", "by", "plan_digest"):
            if s.group.get(key) != first.group.get(key):
                raise UsageError(f"{s.source}: group {key} {s.group.get(key)!r} differs from "
                                 f"{first.group.get(key)!r} of {first.source}: not shards of one run")
        for key in SAME:
            if s.run.meta.get(key) != first.run.meta.get(key):
                raise UsageError(f"{s.source}: {key} {s.run.meta.get(key)!r} differs from "
                                 f"{first.run.meta.get(key)!r} of {first.source}: not shards of one run")
    of, plan = int(first.group["of"]), [list(ids) for ids in first.group["plan"]]
    planned = {nodeid: i for i, ids in enumerate(plan, 1) for nodeid in ids}
    soc_of: dict[str, str] = dict(first.group.get("soc_of") or {})

    records: list[TestRecord] = []
    owner: dict[str, Shard] = {}
    unfinished: dict[int, list[str]] = {}
    for s in shards:
        for r in s.run.records:
            if r.nodeid in owner:
                if r.nodeid not in planned:  # e.g. a module's collection error: every shard has it
                    continue
                raise UsageError(f"test {r.nodeid} has results in {owner[r.nodeid].source} and in "
                                 f"{s.source}: not shards of one run")
            if r.nodeid in planned and planned[r.nodeid] != s.index:
                raise UsageError(f"{s.source}: test {r.nodeid} belongs to shard {planned[r.nodeid]}/{of} "
                                 f"of the plan, not to this shard {s.index}/{of}")
            owner[r.nodeid] = s
            records.append(r)
        lost = [n for n in plan[s.index - 1] if n not in owner]
        if lost:
            unfinished[s.index] = lost
            records += [_no_result(n, soc_of.get(n), f"no result: shard {s.index}/{of} ({s.source}, run "
                                      f"{s.run.meta.get('run_id', '?')}) ended before it"
                                      + (" (interrupted)" if s.run.meta.get("partial") else ""))
                        for n in lost]
    present = [s.index for s in shards]
    missing = [i for i in range(1, of + 1) if i not in present]
    for i in missing:
        records += [_no_result(n, soc_of.get(n), f"no result: shard {i}/{of} of group {first.group['id']} is missing "
                                  f"(its run was not given to the merge, or never reported)")
                    for n in plan[i - 1]]
    meta = _meta(shards, missing, unfinished)
    meta["verdict"] = verdict(records, interrupted=bool(meta["partial"])).value
    return Merged(QualificationResults(meta, records), present, missing, unfinished)


def _no_result(nodeid: str, soc: str | None, message: str) -> TestRecord:
    return TestRecord(nodeid, Outcome.ERROR, soc=soc or None, message=message, error_kind=ErrorKind.INFRA,
                      error_type="ShardMissing")


def _epoch(text: Any) -> float | None:
    try:
        when = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def _meta(shards: Sequence[Shard], missing: list[int], unfinished: dict[int, list[str]]) -> dict[str, Any]:
    first = shards[0]
    group = first.group
    meta = {k: v for k, v in first.run.meta.items()
            if k not in ("run_id", "pytest_exit", "wall_s", "report_dir", "written_at", "verdict")}
    starts = [(e, s.run.meta["started_at"]) for s in shards
              if (e := _epoch(s.run.meta.get("started_at"))) is not None]
    ends = [(e, s.run.meta["ended_at"]) for s in shards
            if (e := _epoch(s.run.meta.get("ended_at"))) is not None]
    if starts:
        meta["started_at"] = min(starts)[1]
    if ends:
        meta["ended_at"] = max(ends)[1]
    if starts and ends:
        meta["wall_s"] = max(ends)[0] - min(starts)[0]
    devices: dict[str, dict] = {}
    capacity: dict[str, int] = {}
    socs: set[str] = set()
    events: list[dict] = []
    seen_events: set[str] = set()
    for s in shards:
        for d in s.run.meta.get("devices") or []:
            devices.setdefault(str(d.get("serial")), d)
        for soc, n in (s.run.meta.get("capacity") or {}).items():
            capacity[soc] = max(capacity.get(soc, 0), int(n))
        socs.update(s.run.meta.get("socs") or [])
        for e in s.run.meta.get("infra_events") or []:
            key = repr(sorted(e.items())) if isinstance(e, dict) else repr(e)
            if key not in seen_events:
                seen_events.add(key)
                events.append(e)
    # partial, as a run's: a shard was cut off (its report is partial, the merge's is too). A missing
    # shard is not an interruption of this run: its tests are infrastructure errors (exit 3).
    partial = any(s.run.meta.get("partial") for s in shards)
    meta.update({
        "run_id": f"group-{group['id']}",
        "devices": sorted(devices.values(), key=lambda d: (str(d.get("soc")), str(d.get("serial")))),
        "capacity": capacity, "socs": sorted(socs), "infra_events": events,
        "virtual": any(s.run.meta.get("virtual") for s in shards),
        "partial": partial,
        "interrupted": any(s.run.meta.get("interrupted") for s in shards),
        "group": {
            "id": group["id"], "of": int(group["of"]), "by": group.get("by", "soc"),
            "plan_digest": group.get("plan_digest"), "plan": group["plan"],
            "soc_of": group.get("soc_of") or {}, "merged": True,
            "shards": [{"shard": s.index, "source": s.source, "run_id": s.run.meta.get("run_id"),
                        "started_at": s.run.meta.get("started_at"), "ended_at": s.run.meta.get("ended_at"),
                        "verdict": s.run.meta.get("verdict"), "partial": bool(s.run.meta.get("partial")),
                        "tests": len(s.run.records),
                        "unfinished": len(unfinished.get(s.index, []))} for s in shards],
            "missing": missing,
        },
    })
    return meta
