"""The fault matrix of `farm chaos`: every row is a test. Each scenario injects its fault for real and
checks outcomes, the report, the pool's event log and the files (see farm/selftest/chaos.py); here
every check must hold and no finished result may be lost."""

from __future__ import annotations

import pytest

from farm.selftest.chaos import SCENARIOS, run_scenario
from farm.selftest.postgres import pg_base_url


@pytest.mark.parametrize("name", [pytest.param(s.name, marks=[pytest.mark.postgres])
                                  if s.name == "pool-down" else s.name for s in SCENARIOS])
def test_fault_is_survived_and_nothing_is_lost(name, tmp_path, tiny_bundle):
    if name == "pool-down" and pg_base_url() is None:
        pytest.skip("PTEFARM_TEST_PG_URL is empty: PostgreSQL tests disabled")
    obs = run_scenario(name, tmp_path / name, tiny_bundle)
    assert obs.survived, f"{obs.observed}\nfailed checks: {obs.failed_checks()}"
    assert obs.lost == 0, obs.observed


BROKEN_FARM = """
# A farm variant that lets garbage through (the false pass the matrix exists to catch).
import ptefarm_fixtures.llm as llm_module
from farm.errors import RunIncomplete

_generate = llm_module.LLM.generate

def generate(self, *args, **kwargs):
    try:
        return _generate(self, *args, **kwargs)
    except RunIncomplete as e:
        if "garbage" not in str(e):
            raise
        return type("Result", (), {"text": "looks fine"})()

llm_module.LLM.generate = generate
"""


def test_the_matrix_catches_a_farm_that_passes_garbage(tmp_path, tiny_bundle):
    from farm.selftest.chaos import Lab, runner_garbage

    with Lab(tmp_path / "broken", tiny_bundle) as lab:
        (lab.dir / "conftest.py").write_text(BROKEN_FARM)
        obs = runner_garbage(lab)
    assert not obs.survived
    assert "error, never a pass" in obs.failed_checks()
