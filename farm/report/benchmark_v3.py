"""A run as records of the PyTorch benchmark database, schema v3 (``oss_ci_benchmark_v3``), so results
can go to the dashboards ExecuTorch uses.

The shape follows pytorch/test-infra's table (clickhouse_db_schema/oss_ci_benchmark_v3) and
ExecuTorch's .github/scripts/extract_benchmark_results.py: one record per metric with ``benchmark``
{name, mode, dtype, extra_info}, ``model`` {name, type, backend, origins, extra_info}, ``metric``
{name, benchmark_values, target_value, extra_info}, ``runners`` [the 11-field runner], ``inputs`` and
``dependencies``. Every ``extra_info`` is a map of strings (the table's ``Map(String, String)``). The
upload step adds the envelope (timestamp, repo, head_sha, workflow_id, ...), not this file.

- Throughput: one record per measured point of a test, ``token_per_sec`` (ExecuTorch's name for
  tok/s) with every measured run in ``benchmark_values`` (warm-ups dropped) and the minimum as
  ``target_value`` (0 when no rule gives one); the gate's verdict in ``metric.extra_info``.
- A failed test: a ``FAILURE_REPORT`` record, as ExecuTorch writes for a failed job, with
  ``benchmark_values`` [0] (the table's column is an array; upstream's script writes a bare 0).
- An errored test (infrastructure, bad input): an ``ERROR_REPORT`` record of the same shape. It is
  not a failure of the code under test, so it is never reported as one; a dashboard that only knows
  FAILURE_REPORT shows it as another metric instead of a failure.
"""

from __future__ import annotations

from typing import Any

from farm.report.qualification import devices_of
from farm.results.gate import GateResult, measurements_of, point_key
from farm.results.records import QualificationResults, TestRecord
from farm.vocab import ErrorKind, Outcome, Timing

__all__ = ["FORMAT", "records"]

FORMAT = "pytorch-benchmark-v3"
METRIC_NAMES = {"tok_s": "token_per_sec"}
BACKENDS = {"qnn": "qnn", "qualcomm": "qnn", "host": "xnnpack"}


def _strings(d: dict[str, Any]) -> dict[str, str]:
    return {str(k): "" if v is None else (str(v).lower() if isinstance(v, bool) else str(v))
            for k, v in d.items()}


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return ""


def _runner(record: TestRecord, devices: dict[str, Any], virtual_run: bool) -> dict[str, Any]:
    d = devices.get(record.serial or "")
    virtual = d.virtual if d is not None and d.virtual is not None else virtual_run
    android = d.android if d is not None else ""
    return {
        "name": (d.model if d is not None and d.model else "") or record.serial or f"any {record.soc}",
        "type": f"Android {android}".strip() if android else (record.soc or ""),
        "cpu_info": record.soc or "", "cpu_count": 0, "mem_info": "", "avail_mem_in_gb": 0,
        "gpu_info": f"Hexagon {d.htp_arch}" if d is not None and d.htp_arch else "",
        "gpu_count": 0, "gpu_mem_info": "", "avail_gpu_mem_in_gb": 0,
        "extra_info": _strings({"serial": record.serial or "", "soc": record.soc or "",
                                "htp_arch": d.htp_arch if d is not None else "", "virtual": virtual,
                                "timing": d.timing if d is not None else ""}),
    }


def records(run: QualificationResults, gate: GateResult | None = None) -> list[dict[str, Any]]:
    """Every v3 record of the run (throughput points, FAILURE_REPORT and ERROR_REPORT)."""
    meta = run.meta
    devices = {d.serial: d for d in devices_of(run)}
    virtual_run = bool(meta.get("virtual"))
    by_key = {p.key: p for p in gate.points} if gate is not None else {}
    dialect = str(meta.get("runner_dialect") or "")
    common_benchmark = {"app_type": "ptefarm", "run_id": meta.get("run_id", ""),
                        "purpose": meta.get("purpose", ""), "git_revision": meta.get("git_revision", ""),
                        "bundle_digest": meta.get("bundle_digest", ""), "runner_dialect": dialect,
                        "virtual": virtual_run}
    model = {"name": str(meta.get("bundle_name") or ""), "type": "OSS model",
             "backend": BACKENDS.get(dialect.split("-")[0], dialect), "origins": [],
             "extra_info": _strings({"bundle_digest": meta.get("bundle_digest", "")})}
    dependencies = {
        "executorch": {"repo": "pytorch/executorch", "branch": "", "sha": "",
                       "version": str(meta.get("executorch_version") or _version("executorch")),
                       "extra_info": {}},
        "ptefarm": {"repo": "ptefarm", "branch": "", "sha": str(meta.get("git_revision") or ""),
                    "version": str(meta.get("tool_version") or _version("ptefarm")), "extra_info": {}},
    }
    out = []
    for r in run.records:
        runner = _runner(r, devices, virtual_run)
        base = {"model": model, "runners": [runner], "dependencies": dependencies}
        if r.outcome in (Outcome.FAILED, Outcome.ERROR):
            kind = ("test failure" if r.outcome == Outcome.FAILED else
                    "bad input" if r.error_kind == ErrorKind.USAGE else "infrastructure")
            out.append({**base, "benchmark": {
                "name": "ExecuTorch", "mode": "inference", "dtype": "",
                "extra_info": _strings({**common_benchmark, "test": r.nodeid,
                                        "job_conclusion": "failure" if r.outcome == Outcome.FAILED else "error",
                                        "failure_level": "TEST", "kind": kind, "attempts": len(r.attempts) + 1,
                                        "message": r.message[:500]})},
                "metric": {"name": "FAILURE_REPORT" if r.outcome == Outcome.FAILED else "ERROR_REPORT",
                           "benchmark_values": [0.0], "target_value": 0.0,
                           "extra_info": _strings({"method": "", "outcome": str(r.outcome)})},
                "inputs": {}})
        if r.outcome not in (Outcome.PASSED, Outcome.FAILED):
            continue  # an error measured nothing the farm can vouch for
        for m in measurements_of(r, str(meta.get("run_id", "?"))):
            if not m.values:
                continue
            point = by_key.get(point_key(r, m))
            gate_info = {} if point is None else {
                "gate_verdict": point.verdict, "p_value": point.p_value, "delta": point.delta,
                "baseline_median": point.base_median, "baseline_run": gate.baseline_id}
            timing = m.timing or (devices[r.serial].timing if r.serial in devices else "")
            name = METRIC_NAMES.get(m.metric, m.metric)
            out.append({**base, "benchmark": {
                "name": "ExecuTorch", "mode": "inference", "dtype": "",
                "extra_info": _strings({**common_benchmark, "test": r.nodeid, "kv_mode": m.mode,
                                        "seq_len": m.seq_len, "updater": m.updater, "timing": timing,
                                        "simulated": timing == Timing.SIMULATED})},
                # A simulated or host-CPU figure under the measured metric's name would be plotted
                # as a phone's: only a measured one has the plain name.
                "metric": {"name": name if timing == Timing.MEASURED else f"{name}({timing or 'unknown timing'})",
                           "benchmark_values": [float(v) for v in m.values],
                           "target_value": float(m.threshold or 0.0),
                           "extra_info": _strings({"method": "generate", "unit": m.unit,
                                                   "outcome": str(r.outcome), **gate_info})},
                "inputs": {"prompt": {"dtype": "tokens", "extra_info": _strings(
                    {"mode": m.mode, "seq_len": m.seq_len, "updater": m.updater})}}})
    return out
