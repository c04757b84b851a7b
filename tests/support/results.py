"""A stored run for the results store and history tests."""

from __future__ import annotations

from farm.results.records import Attempt, Measurement, QualificationResults, TestRecord
from farm.vocab import ErrorKind, Outcome


def make_run(run_id: str = "20250101-120000-000001", *, started_at: str = "2025-01-01T12:00:00+0000",
             purpose: str = "nightly", bundle: str = "stories_110m", verdict: str = "fail",
             tok_s: tuple[float, ...] = (41.25, 40.5, 39.875)) -> QualificationResults:
    """A run with every kind of record: passed with measurements, failed, an infra error after a
    spoiled attempt, bad input, skipped, and one that never got a device."""
    meta = {"run_id": run_id, "purpose": purpose, "git_revision": "0123456789ab",
            "bundle_name": bundle, "bundle_digest": "ab" * 32, "runner_dialect": "qnn",
            "started_at": started_at, "ended_at": "2025-01-01T12:10:00+0000", "wall_s": 600.25,
            "verdict": verdict, "virtual": True, "tool_version": "0.1.0", "partial": False,
            "units": {"tok_s": "tok/s", "duration_s": "s"},
            "devices": [{"serial": "vdev-1", "soc": "SM8650", "model": "Galaxy S24",
                         "android": "14 (sdk 34)", "htp_arch": "v75", "virtual": True}],
            "manifest": [{"name": "model.pte", "sha256": "cd" * 32, "size": 1234, "role": "pte"}],
            "infra_events": [{"at": "2025-01-01T12:05:00+00:00", "serial": "vdev-2",
                              "kind": "quarantine", "reason": "3 failures"}],
            "nested": {"ünïcode": ["x", 1, 2.5, None, True]}}
    records = [
        TestRecord("suites/test_throughput.py::test_min_throughput[SM8650-kv-64-SmartMask]",
                   Outcome.PASSED, soc="SM8650", serial="vdev-1", duration_s=12.125,
                   properties={"tok_s.SmartMask": "40.50", "mode": "kv"}, finished_at=1735733000.5,
                   measurements=[Measurement("tok_s", "tok/s", list(tok_s), "SmartMask", "kv", 64, 30.0,
                                             timing="host-cpu"),
                                 Measurement("tok_s", "tok/s", [1e-300, 1e300], "ShiftPointer", "kv",
                                             64, None)]),
        TestRecord("suites/test_correctness.py::test_updaters_agree[SM8650-story]", Outcome.FAILED,
                   soc="SM8650", serial="vdev-1", message="diverge at 3", details="Traceback\n  ...",
                   error_type="AssertionError", duration_s=3.0),
        TestRecord("suites/test_smoke.py::test_generates[SM8650]", Outcome.ERROR, soc="SM8650",
                   serial="vdev-2", message="device gone", error_kind=ErrorKind.INFRA,
                   error_type="DeviceGone", attempts=[Attempt("vdev-3", "DeviceGone: unplugged", 1.5)]),
        TestRecord("<collection>", Outcome.ERROR, error_kind=ErrorKind.USAGE, message="bad case file"),
        TestRecord("suites/test_smoke.py::test_skipped[SM8550]", Outcome.SKIPPED, soc="SM8550",
                   message="no rule"),
    ]
    return QualificationResults(meta, records)
