#!/usr/bin/env bash
# The main job: a parallel qualification run of the reference bundle on virtual Snapdragon devices
# (2 x SM8650, SM8550, SM8750; one pytest-xdist worker per device). Sets itself up on a fresh machine;
# reports land in reports/latest (junit/<device>.xml, summary.md, results.json).
# Extra arguments add to these defaults (e.g. --virtual SM8850, --bundle MANIFEST, -- -m gate).
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
options=() pytest_args=()
for arg in "$@"; do  # everything from `--` on goes to pytest, after our own options
  if [ "${#pytest_args[@]}" -gt 0 ] || [ "$arg" = "--" ]; then pytest_args+=("$arg"); else options+=("$arg"); fi
done
exec farm qualify --out reports/latest --virtual SM8650:2 --virtual SM8550 --virtual SM8750 \
  ${options[@]+"${options[@]}"} ${pytest_args[@]+"${pytest_args[@]}"}
