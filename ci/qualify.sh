#!/usr/bin/env bash
# The main job: a parallel qualification run of the reference bundle on virtual Snapdragon devices.
# Sets itself up on a fresh machine; reports land in reports/latest (JUnit per device, summary.md).
# Extra arguments go to `farm qualify` (e.g. --bundle MANIFEST, --virtual SM8750:2).
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
if [ "$#" -eq 0 ]; then
  set -- --virtual SM8650:2 --virtual SM8550 --virtual SM8750
fi
exec farm qualify --out reports/latest "$@"
