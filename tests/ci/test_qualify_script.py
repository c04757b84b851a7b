"""ci/qualify.sh's own options, refused before any device starts (its legs run on the job's own
virtual devices: a --config has no meaning there). The job itself is the README's main command,
run in full by whoever runs it; its legs are `farm qualify`, tested in tests/cli/test_qualify.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _qualify_sh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.run([str(REPO / "ci" / "qualify.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["--config", "farm.toml"], "--config: the main job runs on its own virtual devices"),
    (["--config=farm.toml"], "--config: the main job runs on its own virtual devices"),
    (["--virtual"], "--virtual needs a value"),
    (["--purpose", "release", "--virtual-timing"], "--virtual-timing needs a value"),
])
def test_options_it_cannot_take_are_bad_input_before_any_device(tmp_path, args, message):
    proc = _qualify_sh(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert not list(tmp_path.glob("ptefarm-qualify.*"))  # no job state made, so no device started
