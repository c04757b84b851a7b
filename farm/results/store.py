"""The results store: every run of the farm's suites, kept in the pool's database (SQLite or
PostgreSQL alike), for ``farm history``, named baselines and the regression gate.

Tables (migration 4 of farm.db.migrations):

- ``runs``: one row per run; the columns history filters and sorts on, and ``meta``, the run's whole
  meta as results.json carries it (JSON text, not JSONB: it reads back byte for byte, keys in order).
- ``test_results``: one row per test in the run's order (``seq``), attempts and properties as JSON.
- ``measurements``: one row per ``Measurement`` (a metric at one point of one test) with its samples
  as a JSON array in measured order: the gate reads a point's samples together, so a row per sample
  would only multiply rows.
- ``baselines``: a name (``v1.0``) pinned to a run; a pinned run is never pruned.

Where results go: the configured pool's database (``pool.url`` of the farm config, whose default is
the SQLite pool under the farm home, ``$PTEFARM_HOME/pool.db``), for runs on phones and on virtual
devices alike. A virtual run leases from a private pool that is deleted with the run, so its results
are saved to the configured pool's database too: ``farm history`` finds every run of a farm in one
place. ``--url`` on the CLI reads another.

Saving is one transaction and replaces a run saved before under the same id: a reader sees the whole
run or none of it, and an interrupted save (Ctrl-C, a dropped connection) leaves the previous state.
Retention: ``prune`` deletes runs older than ``results.retention_days`` (default 180) of the config,
except runs a baseline names.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Self

from farm.db.base import Store, StoreOwner, Txn, Where
from farm.db.connect import open_store
from farm.errors import UsageError
from farm.results.changes import PointSeries, RunPoint
from farm.results.gate import figure_timings
from farm.results.records import (
    RESULTS_SCHEMA_VERSION,
    Attempt,
    Measurement,
    QualificationResults,
    TestRecord,
)
from farm.vocab import PURPOSES, ErrorKind, Outcome, Verdict

__all__ = ["Baseline", "ResultsStore", "QualificationSummary", "results_url"]

BASELINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}")
DAY_S = 86400.0


def results_url(config: Any) -> str:
    """Where a run's results go and ``farm history`` reads: the configured pool's database."""
    return config.pool.url


@dataclass(frozen=True)
class Baseline:
    name: str
    run_id: str
    created: float  # pool clock, epoch seconds
    created_by: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class QualificationSummary:
    """One line of ``farm history``."""

    run_id: str
    started_at: str
    purpose: str
    bundle_name: str
    bundle_digest: str
    git_revision: str
    verdict: str
    virtual: bool
    partial: bool
    passed: int
    failed: int
    errors: int
    skipped: int
    devices: tuple[str, ...]  # "SoC serial", sorted
    baselines: tuple[str, ...]  # names pinned to this run
    shard: str = ""  # "K/N" for a shard of a group run

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "devices": list(self.devices), "baselines": list(self.baselines)}


# -- checking what is saved ---------------------------------------------------------------------------

def _epoch(text: Any, run_id: str) -> float:
    """``meta.started_at`` (ISO 8601) as epoch seconds; a time without offset is taken as UTC."""
    try:
        when = datetime.fromisoformat(str(text))
    except ValueError:
        raise UsageError(f"run {run_id}: meta.started_at {text!r} is not an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _json(value: Any, where: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{where}: cannot be stored as JSON: {e}") from None


def _check_run(run: QualificationResults) -> str:
    """The run's id, once every field the tables need is of the right kind."""
    meta = run.meta
    if not isinstance(meta, dict):
        raise UsageError(f"run results: meta must be a mapping, got {type(meta).__name__}")
    run_id = meta.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        raise UsageError("run results: meta.run_id must be a non-empty string")
    purpose = meta.get("purpose", "adhoc")
    if purpose not in PURPOSES:
        raise UsageError(f"run {run_id}: meta.purpose {purpose!r} is not one of {', '.join(PURPOSES)}")
    try:
        Verdict(meta.get("verdict"))
    except ValueError:
        raise UsageError(f"run {run_id}: meta.verdict {meta.get('verdict')!r} is not one of "
                         f"{', '.join(v.value for v in Verdict)}") from None
    for i, record in enumerate(run.records):
        where = f"run {run_id}: record {i} ({getattr(record, 'nodeid', '?')})"
        if not isinstance(record, TestRecord) or not isinstance(record.nodeid, str):
            raise UsageError(f"{where}: not a TestRecord with a nodeid")
        try:
            Outcome(record.outcome)
            ErrorKind(record.error_kind) if record.error_kind else None
        except ValueError as e:
            raise UsageError(f"{where}: {e}") from None
        for j, m in enumerate(record.measurements):
            if not isinstance(m, Measurement) or not m.metric or not m.unit:
                raise UsageError(f"{where}: measurement {j} needs a metric and a unit")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                       for v in m.values):
                raise UsageError(f"{where}: measurement {j} ({m.metric}) has a value that is not a "
                                 f"finite number: {m.values!r}")
    return run_id


# -- the store ----------------------------------------------------------------------------------------

class ResultsStore(StoreOwner):
    """The results tables of one pool database. Open one per process, like a Pool."""

    def __init__(self, store: Store):
        self.store = store

    @classmethod
    def open(cls, url: str, **options: Any) -> Self:
        """Connect to the database at ``url``, creating or migrating its schema."""
        return cls(open_store(url, **options))

    @property
    def where(self) -> str:
        return self.store.display_url

    # -- writing ----------------------------------------------------------------------------------
    def save_run(self, run: QualificationResults) -> None:
        """Save ``run`` in one transaction, replacing a run saved before under its id."""
        run_id = _check_run(run)
        meta = run.meta
        started = _epoch(meta.get("started_at", ""), run_id)
        meta_json = _json(meta, f"run {run_id}: meta")
        rows, measured = [], []
        for seq, r in enumerate(run.records):
            where = f"run {run_id}: record {r.nodeid}"
            rows.append((run_id, seq, r.nodeid, r.suite, r.name, Outcome(r.outcome).value,
                         ErrorKind(r.error_kind).value if r.error_kind else None, r.error_type,
                         r.soc, r.serial, float(r.duration_s), float(r.finished_at), r.message,
                         r.details, _json([asdict(a) for a in r.attempts], f"{where}: attempts"),
                         _json(r.properties, f"{where}: properties")))
            for i, m in enumerate(r.measurements):
                measured.append((run_id, seq, i, r.nodeid, r.soc, r.serial, m.metric, m.unit,
                                 m.updater, m.mode, int(m.seq_len),
                                 None if m.threshold is None else float(m.threshold),
                                 _json([float(v) for v in m.values], f"{where}: measurement {m.metric}"),
                                 str(m.timing or ""),
                                 _json(list(m.conditions), f"{where}: measurement {m.metric} conditions")))
        with self.store.write() as txn:
            # The run row is upserted, not deleted: a baseline's foreign key may point at it.
            txn.run(
                "INSERT INTO runs (run_id, purpose, git_revision, bundle_name, bundle_digest, "
                "runner_dialect, started_at, ended_at, started, verdict, virtual, partial, "
                "tool_version, schema_version, saved, meta, run_group, shard) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id) DO UPDATE SET purpose = excluded.purpose, "
                "git_revision = excluded.git_revision, bundle_name = excluded.bundle_name, "
                "bundle_digest = excluded.bundle_digest, runner_dialect = excluded.runner_dialect, "
                "started_at = excluded.started_at, ended_at = excluded.ended_at, "
                "started = excluded.started, verdict = excluded.verdict, virtual = excluded.virtual, "
                "partial = excluded.partial, tool_version = excluded.tool_version, "
                "schema_version = excluded.schema_version, saved = excluded.saved, meta = excluded.meta, "
                "run_group = excluded.run_group, shard = excluded.shard",
                (run_id, meta.get("purpose", "adhoc"), str(meta.get("git_revision") or ""),
                 str(meta.get("bundle_name") or ""), str(meta.get("bundle_digest") or ""),
                 str(meta.get("runner_dialect") or ""), str(meta.get("started_at") or ""),
                 str(meta.get("ended_at") or ""), started, str(meta["verdict"]),
                 int(bool(meta.get("virtual"))), int(bool(meta.get("partial"))),
                 str(meta.get("tool_version") or ""), RESULTS_SCHEMA_VERSION, txn.now, meta_json,
                 *_group_columns(meta)))
            txn.run("DELETE FROM measurements WHERE run_id = ?", (run_id,))
            txn.run("DELETE FROM test_results WHERE run_id = ?", (run_id,))
            for row in rows:
                txn.run("INSERT INTO test_results (run_id, seq, nodeid, suite, name, outcome, "
                        "error_kind, error_type, soc, serial, duration_s, finished_at, message, "
                        "details, attempts, properties) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
            for row in measured:
                txn.run("INSERT INTO measurements (run_id, result_seq, seq, nodeid, soc, serial, "
                        "metric, unit, updater, mode, seq_len, threshold, samples, timing, conditions) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def set_baseline(self, name: str, run_id: str, created_by: str = "") -> str | None:
        """Name ``run_id`` as baseline ``name`` (moving the name if it named another run); returns
        the run the name pointed to before, if any."""
        if not isinstance(name, str) or not BASELINE_NAME.fullmatch(name):
            raise UsageError(f"baseline name {name!r} must be 1-64 characters of letters, digits and "
                             f"_ . : + - (starting with a letter or digit)")
        with self.store.write() as txn:
            row = txn.one("SELECT run_id, run_group, shard FROM runs WHERE run_id = ?", (run_id,))
            if row is None:
                raise UsageError(self._no_run(txn, run_id))
            if row["shard"]:
                raise UsageError(f"run {run_id} is shard {row['shard']} of group {row['run_group']}, "
                                 f"not a whole run: name the merged run (farm report merge --group "
                                 f"{row['run_group']}: run group-{row['run_group']})")
            old = txn.one("SELECT run_id FROM baselines WHERE name = ?", (name,))
            txn.run("INSERT INTO baselines (name, run_id, created, created_by) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET run_id = excluded.run_id, "
                    "created = excluded.created, created_by = excluded.created_by",
                    (name, run_id, txn.now, created_by))
        return old["run_id"] if old else None

    def prune(self, older_than_days: float) -> list[str]:
        """Delete runs that started more than ``older_than_days`` ago, except those a baseline names;
        returns their ids."""
        if not (isinstance(older_than_days, (int, float)) and math.isfinite(older_than_days)
                and older_than_days > 0):
            raise UsageError(f"prune: older than {older_than_days!r} days: must be a finite number > 0")
        with self.store.write() as txn:
            cutoff = txn.now - older_than_days * DAY_S
            doomed = [r["run_id"] for r in txn.all(
                "SELECT run_id FROM runs WHERE started < ? AND run_id NOT IN "
                "(SELECT run_id FROM baselines) ORDER BY started", (cutoff,))]
            for run_id in doomed:
                txn.run("DELETE FROM measurements WHERE run_id = ?", (run_id,))
                txn.run("DELETE FROM test_results WHERE run_id = ?", (run_id,))
                txn.run("DELETE FROM runs WHERE run_id = ?", (run_id,))
        return doomed

    # -- reading ----------------------------------------------------------------------------------
    def load_run(self, run_id: str) -> QualificationResults:
        """The run exactly as it was saved; a run that is not stored is a UsageError naming it."""
        with self.store.read() as txn:
            return self._load(txn, run_id)

    def _no_run(self, txn: Txn, run_id: str) -> str:
        latest = [r["run_id"] for r in txn.all("SELECT run_id FROM runs ORDER BY started DESC, "
                                                "run_id DESC LIMIT 3")]
        hint = f" (latest: {', '.join(latest)})" if latest else " (it holds no run)"
        return f"run {run_id!r} is not in the results store at {self.where}{hint}"

    def _load(self, txn: Txn, run_id: str) -> QualificationResults:
        row = txn.one("SELECT meta FROM runs WHERE run_id = ?", (run_id,))
        if row is None:
            raise UsageError(self._no_run(txn, run_id))
        measured: dict[int, list[Measurement]] = {}
        for m in txn.all("SELECT * FROM measurements WHERE run_id = ? ORDER BY result_seq, seq",
                         (run_id,)):
            measured.setdefault(int(m["result_seq"]), []).append(Measurement(
                metric=m["metric"], unit=m["unit"], values=json.loads(m["samples"]),
                updater=m["updater"], mode=m["mode"], seq_len=int(m["seq_len"]),
                threshold=m["threshold"], timing=m["timing"] or "",
                conditions=json.loads(m["conditions"] or "[]")))
        records = []
        for r in txn.all("SELECT * FROM test_results WHERE run_id = ? ORDER BY seq", (run_id,)):
            records.append(TestRecord(
                nodeid=r["nodeid"], outcome=Outcome(r["outcome"]), soc=r["soc"], serial=r["serial"],
                message=r["message"], details=r["details"],
                error_kind=ErrorKind(r["error_kind"]) if r["error_kind"] else None,
                error_type=r["error_type"], duration_s=r["duration_s"],
                attempts=[Attempt(**a) for a in json.loads(r["attempts"])],
                properties=json.loads(r["properties"]), finished_at=r["finished_at"],
                measurements=measured.get(int(r["seq"]), [])))
        return QualificationResults(meta=json.loads(row["meta"]), records=records)

    def list_runs(self, limit: int | None = 20, purpose: str | None = None,
                  bundle: str | None = None, run_ids: Sequence[str] | None = None,
                  group: str | None = None) -> list[QualificationSummary]:
        """The latest runs first, optionally of one purpose, one bundle name, or these ids. Whole runs
        only (a group's merged run, never its shards), unless ``group`` is given: then that group's
        runs, its shards included."""
        if purpose is not None and purpose not in PURPOSES:
            raise UsageError(f"purpose {purpose!r} is not one of {', '.join(PURPOSES)}")
        if limit is not None and limit < 1:
            raise UsageError(f"limit must be >= 1, got {limit}")
        where = Where()
        if group is not None:
            where.add("run_group = ?", group)
        elif run_ids is None:
            where.add("shard = ''")
        where.equal(purpose=purpose, bundle_name=bundle)
        if run_ids is not None:
            if not run_ids:
                return []
            where.add(f"run_id IN ({', '.join('?' * len(run_ids))})", *run_ids)
        sql = ("SELECT run_id, started_at, purpose, bundle_name, bundle_digest, git_revision, verdict, "
               "virtual, partial, shard FROM runs" + where.sql() + " ORDER BY started DESC, run_id DESC")
        params = where.params
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        with self.store.read() as txn:
            runs = txn.all(sql, params)
            ids = [r["run_id"] for r in runs]
            counts: dict[str, dict[str, int]] = {i: {} for i in ids}
            devices: dict[str, set[str]] = {i: set() for i in ids}
            names: dict[str, list[str]] = {i: [] for i in ids}
            for chunk in _chunks(ids, 500):
                marks = ", ".join("?" * len(chunk))
                for c in txn.all(f"SELECT run_id, outcome, COUNT(*) AS n FROM test_results "
                                 f"WHERE run_id IN ({marks}) GROUP BY run_id, outcome", chunk):
                    counts[c["run_id"]][c["outcome"]] = int(c["n"])
                for d in txn.all(f"SELECT DISTINCT run_id, soc, serial FROM test_results "
                                 f"WHERE run_id IN ({marks}) AND serial IS NOT NULL", chunk):
                    devices[d["run_id"]].add(f"{d['soc'] or '?'} {d['serial']}")
                for b in txn.all(f"SELECT name, run_id FROM baselines WHERE run_id IN ({marks}) "
                                 f"ORDER BY name", chunk):
                    names[b["run_id"]].append(b["name"])
        return [QualificationSummary(
            run_id=r["run_id"], started_at=r["started_at"], purpose=r["purpose"],
            bundle_name=r["bundle_name"], bundle_digest=r["bundle_digest"],
            git_revision=r["git_revision"], verdict=r["verdict"], virtual=bool(r["virtual"]),
            partial=bool(r["partial"]), passed=counts[r["run_id"]].get("passed", 0),
            failed=counts[r["run_id"]].get("failed", 0), errors=counts[r["run_id"]].get("error", 0),
            skipped=counts[r["run_id"]].get("skipped", 0),
            devices=tuple(sorted(devices[r["run_id"]])), baselines=tuple(names[r["run_id"]]),
            shard=r["shard"] or "")
            for r in runs]

    def point_series(self, *, purpose: str | None = "nightly", bundle: str | None = None,
                     limit: int = 200) -> list[PointSeries]:
        """Every point's samples over the latest ``limit`` runs (of a purpose, of a bundle), oldest
        run first: the history farm.results.changes looks for change points in. A point whose figures
        changed origin (measured, host-CPU, simulated) is one series per origin."""
        runs = self.list_runs(limit=limit, purpose=purpose, bundle=bundle)
        ids = [r.run_id for r in runs]
        started = {r.run_id: _epoch(r.started_at, r.run_id) for r in runs}  # as save_run stored it
        series: dict[tuple, PointSeries] = {}
        rows = []
        with self.store.read() as txn:
            for chunk in _chunks(ids, 500):
                marks = ", ".join("?" * len(chunk))
                rows += txn.all(f"SELECT run_id, soc, metric, unit, mode, seq_len, updater, samples, timing "
                                f"FROM measurements WHERE run_id IN ({marks})", chunk)
        pooled: dict[tuple, dict[str, list[float]]] = {}
        units: dict[tuple, str] = {}
        for m in rows:
            key = (m["soc"] or "?", m["metric"], m["mode"], int(m["seq_len"]), m["updater"], m["timing"] or "")
            pooled.setdefault(key, {}).setdefault(m["run_id"], []).extend(json.loads(m["samples"]))
            units[key] = m["unit"]
        for key, by_run in sorted(pooled.items()):
            soc, metric, mode, seq_len, updater, timing = key
            points = sorted((RunPoint(run_id, started[run_id], tuple(v), timing)
                             for run_id, v in by_run.items() if v), key=lambda p: (p.started, p.run_id))
            series[key] = PointSeries(soc, metric, mode, seq_len, updater, units[key], timing, points)
        return list(series.values())

    def baselines(self) -> list[Baseline]:
        """Every named baseline, the newest first."""
        with self.store.read() as txn:
            return [Baseline(r["name"], r["run_id"], r["created"], r["created_by"])
                    for r in txn.all("SELECT * FROM baselines ORDER BY created DESC, name")]

    def baseline_info(self, name: str) -> Baseline:
        with self.store.read() as txn:
            return self._baseline_row(txn, name)

    def _baseline_row(self, txn: Txn, name: str) -> Baseline:
        row = txn.one("SELECT * FROM baselines WHERE name = ?", (name,))
        if row is None:
            known = [r["name"] for r in txn.all("SELECT name FROM baselines ORDER BY name")]
            raise UsageError(f"no baseline named {name!r} in the results store at {self.where} "
                             f"({'baselines: ' + ', '.join(known) if known else 'it has none'}; "
                             f"name one with: farm baseline set RUN --name NAME)")
        return Baseline(row["name"], row["run_id"], row["created"], row["created_by"])

    def baseline(self, name: str) -> QualificationResults:
        """The run baseline ``name`` names."""
        with self.store.read() as txn:
            return self._load(txn, self._baseline_row(txn, name).run_id)

    def latest_baseline(self, bundle_name: str | None = None, *,
                        timings: frozenset[str] | None = None) -> tuple[Baseline, QualificationResults] | None:
        """The most recently named baseline (of a run of ``bundle_name``, when given), or None.
        ``timings``: only a run whose figures have these timings (farm.vocab.Timing: a phone run's
        baseline is never a simulated or host-CPU run, nor the other way round)."""
        sql = ("SELECT b.* FROM baselines b JOIN runs r ON r.run_id = b.run_id"
               + " WHERE r.shard = ''" + (" AND r.bundle_name = ?" if bundle_name is not None else "")
               + " ORDER BY b.created DESC, b.name DESC")
        with self.store.read() as txn:
            for row in txn.all(sql, (bundle_name,) if bundle_name is not None else ()):
                info = Baseline(row["name"], row["run_id"], row["created"], row["created_by"])
                run = self._load(txn, info.run_id)
                if timings is None or figure_timings(run) == timings:
                    return info, run
        return None


def _group_columns(meta: dict[str, Any]) -> tuple[str, str]:
    """(run_group, shard) of a run: a shard's group and "K/N", a merged run's group and ''."""
    group = meta.get("group")
    if not isinstance(group, dict) or not group.get("id"):
        return "", ""
    if group.get("merged"):
        return str(group["id"]), ""
    return str(group["id"]), f"{group.get('shard')}/{group.get('of')}"


def _chunks(items: Sequence[str], n: int) -> Iterator[list[str]]:
    for i in range(0, len(items), n):
        yield list(items[i:i + n])
