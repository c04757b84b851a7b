"""Fixtures: the reference vision-language bundle (farm/bundle/export_vlm.py), exported once per machine
(cached by content) and once per session here."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smolvlm_bundle() -> Path:
    """Manifest path of the `tiny-smolvlm` reference bundle."""
    from farm.bundle.export_vlm import export_bundle

    return export_bundle("tiny-smolvlm")
