"""ci/export-bundles.sh, which exports every reference bundle before the main job's legs and the
tests need them: a failed export is the caller's failure, its output shown, no export left running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _export_bundles(tmp_path: Path, *args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PTEFARM_HOME": str(home),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([str(REPO / "ci" / "export-bundles.sh"), *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_an_unknown_set_of_bundles_is_bad_input(tmp_path):
    proc = _export_bundles(tmp_path, "nightly", home=tmp_path / "home")
    assert proc.returncode == 2
    assert "nightly: not a set of bundles (main-job, tests)" in proc.stderr


def test_a_cache_that_cannot_be_made_fails_with_the_exports_own_error_and_leaves_nothing(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = _export_bundles(tmp_path, "tests", home=blocker)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot create {blocker / 'exports'}" in proc.stderr
    assert "exporting the reference bundles failed (exit 2" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("ptefarm-export.*"))  # its logs are removed with it
