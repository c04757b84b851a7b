"""The reference bundle's program and tokenizer per mode, as paths the runner's flags take."""

from __future__ import annotations

import pytest

from tests.support.runner import paths


@pytest.fixture()
def kv(tiny_bundle) -> tuple[str, str]:
    return paths(tiny_bundle, "kv")


@pytest.fixture()
def hybrid(tiny_bundle) -> tuple[str, str]:
    return paths(tiny_bundle, "hybrid")
