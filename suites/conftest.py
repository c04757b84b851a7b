"""Fixtures the suites share: the goldens and thresholds of this run's bundle."""

from __future__ import annotations

import pytest

from ptefarm_suites.cases import Golden, Thresholds

from ._data import bundle_goldens, bundle_thresholds


@pytest.fixture(scope="session")
def goldens(pytestconfig) -> list[Golden]:
    return bundle_goldens(pytestconfig)


@pytest.fixture(scope="session")
def thresholds(pytestconfig) -> Thresholds | None:
    return bundle_thresholds(pytestconfig)
