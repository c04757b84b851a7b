#!/usr/bin/env bash
# Set up (or reuse) the project's virtual environment: Python 3.11, pinned torch CPU wheel, the farm.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# Virtual devices confine their commands with bubblewrap (farm/virtual/confine.py), and their
# /system/bin/sh is mksh, Android's shell (upstream's scripts use its [[ ]]).
missing_pkgs=""
command -v bwrap >/dev/null 2>&1 || missing_pkgs="$missing_pkgs bubblewrap"
command -v mksh >/dev/null 2>&1 || missing_pkgs="$missing_pkgs mksh"
if [ -n "$missing_pkgs" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "ci/setup.sh: installing$missing_pkgs (virtual devices: namespaces, Android's shell)" >&2
    # shellcheck disable=SC2086
    apt-get install -y -q $missing_pkgs >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q $missing_pkgs >/dev/null; }
  else
    case "$missing_pkgs" in *bubblewrap*)
      echo "ci/setup.sh: bubblewrap (bwrap) is missing: virtual devices will refuse to start." >&2
      echo "  Install it (Debian/Ubuntu: sudo apt-get install bubblewrap), or run them unconfined" >&2
      echo "  on the host with PTEFARM_VIRTUAL_UNCONFINED=1 (degraded)." >&2;;
    esac
    case "$missing_pkgs" in *mksh*)
      echo "ci/setup.sh: mksh is missing: virtual devices fall back to /bin/sh as /system/bin/sh," >&2
      echo "  where Android scripts' [[ ]] fails (Debian/Ubuntu: sudo apt-get install mksh)." >&2;;
    esac
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
  # uv installs what pip would (the same pins and versions) in a tenth of the time: 1.3 GB of
  # wheels unpacked in parallel, ~8 s against pip's ~70 s on 2 cores.
  python -m pip install -q "uv==0.13.9"
  # torch pinned: an unpinned resolution would pull a multi-GB CUDA build. uv reads no pip config, so
  # pip's find-links (where a machine keeps its CPU wheel of torch) are passed on.
  links=()
  for dir in ${PIP_FIND_LINKS:-} $(python -m pip config get global.find-links 2>/dev/null || true); do
    links+=(--find-links "$dir")
  done
  uv pip install -q --python .venv/bin/python ${links[@]+"${links[@]}"} "torch==2.13.0" -e ".[dev]"
  python -c 'import torch, sys; torch.version.cuda is None or sys.stderr.write(
    "ci/setup.sh: torch is a CUDA build (no CPU wheel among the find-links); it works, but is large\n")'
  touch "$stamp"
fi
# Bytecode. Where PYTHONDONTWRITEBYTECODE is set (these CI machines set it) Python writes no .pyc and
# every process compiles each module it imports from source: torch's start-up 2.2 s -> 4.7 s, the farm
# CLI's 0.5 s -> 1.3 s, and the tests and the main job start thousands of such processes (virtual
# devices, zygotes, workers, CLI calls). Python reads .pyc files whatever that variable says, and
# ci/test.sh and ci/qualify.sh unset it for their processes, so what they import is compiled once and
# kept. Once per install, what every farm process imports is compiled here, by importing it (8 s on
# 2 cores; compiling all of site-packages took 33 s): the job's first devices and workers would
# otherwise all compile torch at once. The project's trees on every call (incremental, a fraction of a
# second).
compiled=.venv/.ptefarm-bytecode
if [ ! -f "$compiled" ] || [ "$stamp" -nt "$compiled" ]; then
  env -u PYTHONDONTWRITEBYTECODE python -c '
import torch, scipy.stats, matplotlib.pyplot, pytest, xdist, junitparser
import farm.cli.main, ptefarm_fixtures.plugin
from farm.runner import zygote
zygote.preload_runner()  # the runner zygote: torch, ExecuTorch runtime, the tokenizer libraries'
  touch "$compiled"
fi
# The JUnit schema the tests validate reports against: from pytest's sdist, hash-checked.
python ci/junit_schema.py
