"""The suites' data for this run's bundle: correctness points, goldens, thresholds."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptefarm_fixtures import ensure_run
from ptefarm_suites.cases import Golden, Thresholds, case_points, load_cases, load_goldens, load_thresholds

DATA = Path(__file__).resolve().parent / "data"


def correctness_points(config: pytest.Config):
    run = ensure_run(config)
    return case_points(load_cases(run.options.cases or DATA / "correctness.toml"), run.bundle)


def bundle_goldens(config: pytest.Config) -> list[Golden]:
    """``--farm-goldens``, else ``goldens.toml`` beside the manifest, else none."""
    run = ensure_run(config)
    path = run.options.goldens or run.manifest.parent / "goldens.toml"
    return load_goldens(path) if run.options.goldens or path.is_file() else []


def bundle_thresholds(config: pytest.Config) -> Thresholds | None:
    """``--farm-thresholds``, else ``thresholds.toml`` beside the manifest, else the suites' file for
    the bundle's name, else none (the throughput suite then has nothing to check)."""
    run = ensure_run(config)
    if run.options.thresholds:
        return load_thresholds(run.options.thresholds, run.bundle)
    for path in (run.manifest.parent / "thresholds.toml", DATA / "thresholds" / f"{run.bundle.name}.toml"):
        if path.is_file():
            return load_thresholds(path, run.bundle)
    return None
