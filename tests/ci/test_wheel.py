"""The wheel carries every file its packages read: built from a copy of the tracked tree (so no build/
or *.egg-info lands in the checkout), it holds each tracked file of farm/, fixtures/ and suites/
under its installed package name (the data .toml files included, which are read at run time through
``Path(__file__)``: farm/runner/timing.py, suites/_data.py), nothing else, and setuptools warns of no
package left out of pyproject's ``packages`` (a data directory is a namespace package to it).

What this cannot see is a wheel that installs yet does not run; that is checked by hand, too slow for
the suite (minutes): the wheel installed (not editable) into a fresh venv with the project's
dependencies hard-linked in from .venv (a .pth to .venv would hide them from a confined virtual device,
and .venv's editable finder would import the checkout), then, outside the tree with an empty
PTEFARM_HOME, `farm export --model tiny` and `farm qualify --virtual SM8650 --out DIR` pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# source tree -> the package name it installs as (pyproject's [tool.setuptools.package-dir])
TREES = {"farm": "farm", "fixtures": "ptefarm_fixtures", "suites": "ptefarm_suites"}
MISSING_PACKAGE = "is absent from the `packages` configuration"  # setuptools' warning


def tracked_files() -> list[str]:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the tracked tree is unknown")
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], check=True,
                         capture_output=True).stdout.decode()
    # A file another change deleted from the work tree but not yet from the index is no longer ours.
    return sorted(p for p in out.split("\0") if p and (REPO / p).is_file())


def installed_name(path: str) -> str | None:
    """Where a tracked file lands in the wheel, or None if it is not in an installed tree."""
    top, _, rest = path.partition("/")
    return f"{TREES[top]}/{rest}" if top in TREES and rest else None


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[zipfile.ZipFile, str, list[str]]:
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist = tmp / "src", tmp / "dist"
    files = tracked_files()
    for rel in files:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    # -v: pip shows the backend's output (setuptools' warnings) only then. TMPDIR and no cache keep
    # pip's own files in this test's directory.
    env = {**os.environ, "TMPDIR": str(tmp), "PIP_NO_CACHE_DIR": "1", "PIP_NO_INPUT": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-v", "-w", str(dist), str(src)], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    (wheel,) = dist.glob("ptefarm-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        yield zf, output, files


def test_build_warns_of_no_package_left_out(built):
    _, output, _ = built
    missing = [line.strip() for line in output.splitlines() if MISSING_PACKAGE in line]
    assert not missing, "\n".join(missing)


def test_wheel_holds_exactly_the_tracked_files_of_its_packages(built):
    zf, _, files = built
    in_wheel = {n for n in zf.namelist() if ".dist-info/" not in n}
    expected = {name for rel in files if (name := installed_name(rel))}
    assert sorted(expected - in_wheel) == [], "tracked files missing from the wheel"
    assert sorted(in_wheel - expected) == [], "files in the wheel that the tree does not track"


def test_every_data_file_is_in_the_wheel_byte_for_byte(built):
    zf, _, files = built
    data = [rel for rel in files if installed_name(rel) and not rel.endswith(".py")]
    # The files read at run time through Path(__file__): a wheel without them fails at the first run.
    assert {"farm/runner/data/phone_timing.toml", "suites/data/correctness.toml",
            "suites/data/thresholds/reference-tiny.toml"} <= set(data)
    for rel in data:
        assert zf.read(installed_name(rel)) == (REPO / rel).read_bytes(), rel
