"""Fixtures: the `tiny` reference bundle in ExecuTorch 1.4.1's layout (farm/bundle/export_v14.py),
exported once per machine (cached by content) and once per session here."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_v14_bundle() -> Path:
    """Manifest path of the `tiny` reference bundle in 1.4.1's layout."""
    from farm.bundle.export_v14 import export_bundle

    return export_bundle("tiny")
