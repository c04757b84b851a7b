"""The reference bundle's kv program and tokenizer, as the runner's flags take them."""

from __future__ import annotations

import pytest

from tests.support.runner import paths


@pytest.fixture()
def kv(tiny_bundle) -> tuple[str, str]:
    return paths(tiny_bundle, "kv")
