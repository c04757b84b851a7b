"""What a pytest run of the ptefarm plugin is given, written by hand, for `farm chaos` and the
project's tests: a test file that generates once per prompt, and the farm's config (farm.toml)."""

from __future__ import annotations

import json
from pathlib import Path

# .format(prompts=[...], seq_len=N): test_generate[SOC-PROMPT], one a prompt and SoC.
GENERATE_TEST = """
import pytest

@pytest.mark.parametrize("prompt", {prompts!r})
def test_generate(llm, prompt):
    result = llm.generate(prompt, mode="kv", seq_len={seq_len})
    assert result.text
"""


def farm_toml(path: Path, adb_port: int, pool_url: str, *, recovery: dict | None = None,
              run: dict | None = None, **pool) -> Path:
    """``[pool]`` keys as keyword arguments; ``recovery`` and ``run``: those tables' keys."""
    lines = ["[[adb_servers]]", 'host = "127.0.0.1"', f"port = {adb_port}", "", "[pool]",
             f'url = "{pool_url}"']
    lines += [f"{k} = {v}" for k, v in pool.items()]
    if recovery is not None:
        lines += ["", "[recovery]"] + [f"{k} = {json.dumps(v)}" for k, v in recovery.items()]
    if run is not None:
        lines += ["", "[run]"] + [f"{k} = {json.dumps(v)}" for k, v in run.items()]
    path.write_text("\n".join(lines) + "\n")
    return path
