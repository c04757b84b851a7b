"""The architecture is a test: the import contracts of pyproject.toml ([tool.importlinter]) hold, and
no module of the farm, the plugin or the suites imports another module's private name.

The contracts are checked by import-linter itself (`lint-imports`, as a developer runs it); that the
check can fail is shown on a copy of the tree with one import that breaks a layer.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pool import REPO

# The installed names of the three top-level packages and the folders they are built from.
PACKAGES = {"farm": "farm", "ptefarm_fixtures": "fixtures", "ptefarm_suites": "suites"}


def lint_imports(root: Path, config: Path) -> subprocess.CompletedProcess:
    # The packages are looked up on sys.path: put `root`'s first (an editable install's finder comes
    # after the path).
    env = {**os.environ, "PYTHONPATH": str(root)}
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--config", str(config), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def copy_tree(dest: Path) -> Path:
    """The three packages under their installed names in ``dest``, with the project's contracts."""
    for name, folder in PACKAGES.items():
        shutil.copytree(REPO / folder, dest / name, ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_the_import_contracts_hold(tmp_path):
    root = copy_tree(tmp_path)
    result = lint_imports(root, root / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


@pytest.mark.parametrize("module, added, expected", [
    # A library module that imports the CLI breaks the layers.
    ("farm/results/gate.py", "from farm.cli import main as _cli", ["farm.results.gate -> farm.cli.main"]),
    # A cycle between two sibling modules is found.
    ("farm/db/base.py", "from farm.db import sqlite as _sqlite", ["No import cycles", "BROKEN"]),
], ids=["layer", "cycle"])
def test_a_broken_contract_is_caught(tmp_path, module, added, expected):
    root = copy_tree(tmp_path)
    victim = root / module
    victim.write_text(victim.read_text() + f"\n{added}  # noqa\n")
    result = lint_imports(root, root / "pyproject.toml")
    assert result.returncode != 0
    assert all(text in result.stdout for text in expected), result.stdout


def private_imports(folder: Path, package: str) -> list[str]:
    """``from X import _name`` where X is another module of ours: a private name used elsewhere."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        module = ".".join((package, *path.relative_to(folder).with_suffix("").parts))
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.split(".")[0] not in PACKAGES or node.module == module:
                continue
            found += [f"{path.relative_to(folder.parent)}:{node.lineno}: {node.module}.{a.name}"
                      for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_imports_a_private_name_of_another():
    found = [line for package, folder in PACKAGES.items() for line in private_imports(REPO / folder, package)]
    assert found == []


def test_the_private_import_check_sees_one(tmp_path):
    (tmp_path / "farm").mkdir()
    (tmp_path / "farm" / "a.py").write_text("from farm.cli.report import _percent, gate_options\n"
                                            "from farm.a import _own\n")
    assert private_imports(tmp_path / "farm", "farm") == ["farm/a.py:1: farm.cli.report._percent"]
