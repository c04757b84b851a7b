#!/usr/bin/env bash
# Set up (or reuse) the project's virtual environment: Python 3.11, pinned torch CPU wheel, the farm.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# Virtual devices confine their commands with bubblewrap (farm/virtual/confine.py).
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "ci/setup.sh: installing bubblewrap (virtual devices run their commands in namespaces)" >&2
    apt-get install -y -q bubblewrap >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }
  else
    echo "ci/setup.sh: bubblewrap (bwrap) is missing: virtual devices will refuse to start." >&2
    echo "  Install it (Debian/Ubuntu: sudo apt-get install bubblewrap), or run them unconfined" >&2
    echo "  on the host with PTEFARM_VIRTUAL_UNCONFINED=1 (degraded)." >&2
  fi
fi
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' || {
  echo "ci/setup.sh: Python 3.11 is required (found $("$PY" --version 2>&1))" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
stamp=.venv/.ptefarm-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # torch first and pinned: an unpinned resolution would pull a multi-GB CUDA build.
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e ".[dev]"
  touch "$stamp"
fi
