"""The published JUnit schema the farm's JUnit and pytest's ``--junitxml`` are validated against in
tests: ``junit-10.xsd``, the JUnit format of Jenkins' xUnit plugin (Surefire's, with its rerun and
flaky elements), the very file pytest validates its own ``--junitxml`` with.

It is not kept in this repository (it is someone else's text, MIT-licensed): the set-up takes it from
the source distribution of the pytest this venv runs, from the package index (no other download), and
checks it against the hash below, so a changed schema is noticed rather than silently used.

    python ci/junit_schema.py    # writes <venv>/share/ptefarm/junit-10.xsd unless it is there
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SHA256 = "a1a816f58d1bf95ebabf371994df0b9246dee66ea9572fbec4f9296f1b2c0ff6"
TARGET = Path(sys.prefix) / "share" / "ptefarm" / "junit-10.xsd"
MEMBER = "testing/example_scripts/junit-10.xsd"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(version: str) -> bytes:
    """junit-10.xsd out of pytest ``version``'s sdist."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                        ":all:", f"pytest=={version}", "-d", tmp], check=True)
        sdists = list(Path(tmp).glob("pytest-*.tar.gz"))
        if len(sdists) != 1:
            raise SystemExit(f"ci/junit_schema.py: pip download of pytest=={version} left "
                             f"{[p.name for p in Path(tmp).iterdir()]}, not one sdist")
        with tarfile.open(sdists[0]) as tar:
            member = tar.extractfile(f"pytest-{version}/{MEMBER}")
            if member is None:
                raise SystemExit(f"ci/junit_schema.py: {sdists[0].name} has no {MEMBER}")
            return member.read()


def main() -> int:
    if TARGET.is_file() and sha256(TARGET.read_bytes()) == SHA256:
        return 0
    version = importlib.metadata.version("pytest")
    data = fetch(version)
    if sha256(data) != SHA256:
        print(f"ci/junit_schema.py: {MEMBER} of pytest {version} has sha256 {sha256(data)}, not "
              f"{SHA256}: the schema changed; read it, then update SHA256 here", file=sys.stderr)
        return 1
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    part = TARGET.with_name(TARGET.name + ".part")
    part.write_bytes(data)
    os.replace(part, TARGET)  # never a half-written schema under the name the tests read
    return 0


if __name__ == "__main__":
    sys.exit(main())
