"""Shards of one qualification: a release run split over several CI jobs (a matrix by SoC or by host),
each running its part of one plan, merged back into one run by ``farm report merge``
(farm.results.group).

Every shard collects the same tests and computes the same plan from them, so no shard needs to hear
from another: the plan is a pure function of the collected test ids, their SoCs and the shard count.
By SoC (the default), a SoC's tests stay in one shard: a shard leases the phones of its SoCs only,
and one SoC's figures come from one job. SoCs are dealt largest first to the least loaded shard
(ties to the lower shard), which is within one SoC's tests of the best split. By test, the sorted
ids are dealt round-robin: even shards, each needing every SoC.

Every shard's run keeps the whole plan in its meta (``group``), so the merge can tell which shard
is missing, and which tests of a shard that did report never got a result.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from farm.errors import UsageError

SHARD_BY = ("soc", "test")
# A group id names the CI run that the shards belong to (``$GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT``); it
# becomes part of the merged run's id and of file names.
GROUP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}")


@dataclass(frozen=True)
class ShardSpec:
    index: int  # 1-based, as CI matrices and humans count
    of: int
    group: str
    by: str = "soc"

    @property
    def label(self) -> str:
        return f"{self.index}/{self.of}"


def parse_shard(text: str, group: str | None, by: str | None = None, *, flag: str = "--farm-shard") -> ShardSpec:
    """``K/N`` with its group id; a UsageError naming the flag for anything else."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if m is None:
        raise UsageError(f"{flag}: {text!r} is not K/N (shard K of N, counted from 1: 1/2, 2/2)")
    index, of = int(m.group(1)), int(m.group(2))
    if not 1 <= index <= of:
        raise UsageError(f"{flag}: {text!r}: K must be between 1 and N")
    prefix = "--farm-" if flag.startswith("--farm-") else "--"
    if not group:
        raise UsageError(f"{flag} needs a group id shared by every shard of the run ({prefix}group "
                         f"ID; ci/nightly.sh takes $GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT)")
    check_group_id(group, f"{prefix}group")
    by = by or "soc"
    if by not in SHARD_BY:
        raise UsageError(f"{prefix}shard-by: {by!r} is not one of {', '.join(SHARD_BY)}")
    return ShardSpec(index, of, group, by)


def check_group_id(group: str, flag: str = "--farm-group") -> str:
    if not GROUP_ID.fullmatch(group or ""):
        raise UsageError(f"{flag}: {group!r} must be 1-64 characters of letters, digits and _ . : + - "
                         f"(starting with a letter or digit)")
    return group


def plan_shards(items: Iterable[tuple[str, str]], of: int, by: str = "soc") -> list[list[str]]:
    """The test ids of each shard (index 0 is shard 1), each shard's ids sorted, from every collected
    (test id, SoC) pair; a test without a device has the SoC ''. The same items in any order give
    the same plan."""
    if of < 1:
        raise UsageError(f"shards: N must be >= 1, got {of}")
    socs: dict[str, str] = {}
    for nodeid, soc in items:
        socs.setdefault(nodeid, soc or "")
    if by == "test":
        ordered = sorted(socs)
        return [ordered[i::of] for i in range(of)]
    if by != "soc":
        raise UsageError(f"shards: by {by!r} is not one of {', '.join(SHARD_BY)}")
    groups: dict[str, list[str]] = {}
    for nodeid, soc in socs.items():
        groups.setdefault(soc, []).append(nodeid)
    shards: list[list[str]] = [[] for _ in range(of)]
    for _, ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        k = min(range(of), key=lambda i: (len(shards[i]), i))
        shards[k].extend(ids)
    return [sorted(s) for s in shards]


def plan_digest(plan: Sequence[Sequence[str]]) -> str:
    """One digest of a plan: two shards that collected different tests, or split them otherwise,
    have different digests, and are not parts of one run."""
    h = hashlib.sha256()
    for i, ids in enumerate(plan, 1):
        for nodeid in ids:
            h.update(f"{i}\0{nodeid}\n".encode())
    return h.hexdigest()[:16]


def group_meta(spec: ShardSpec, plan: list[list[str]], soc_of: dict[str, str]) -> dict:
    """What a shard's run keeps of its group in its meta: the whole plan, and each planned test's
    SoC (a missing shard's tests are reported under their SoC)."""
    return {"id": spec.group, "shard": spec.index, "of": spec.of, "by": spec.by,
            "plan_digest": plan_digest(plan), "plan": plan,
            "soc_of": {n: soc_of[n] for ids in plan for n in ids if soc_of.get(n)}}
