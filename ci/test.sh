#!/usr/bin/env bash
# The project's tests, on a fresh machine or a used one: set-up, services, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ci/start-postgres.sh
# The report tests render the HTML report in Debian's headless chromium.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "ci/test.sh: installing chromium (headless rendering of the HTML report) ..." >&2
  apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
fi
export PTEFARM_TEST_PG_URL=${PTEFARM_TEST_PG_URL-postgresql://postgres@127.0.0.1:5432/test}
# Tests never touch the user's farm state: their own home (bundle cache included, kept between runs).
export PTEFARM_HOME=${PTEFARM_TEST_HOME:-$PWD/.farm/test-home}
# Two workers by default (CI has 2 cores); PTEFARM_TEST_WORKERS=0 runs in one process.
exec python -m pytest -n "${PTEFARM_TEST_WORKERS:-2}" "$@"
