#!/usr/bin/env bash
# The project's tests, on a fresh machine or a used one: set-up, services, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ci/start-postgres.sh
export PTEFARM_TEST_PG_URL=${PTEFARM_TEST_PG_URL-postgresql://postgres@127.0.0.1:5432/test}
# Tests never touch the user's farm state: their own home (bundle cache included, kept between runs).
export PTEFARM_HOME=${PTEFARM_TEST_HOME:-$PWD/.farm/test-home}
# Two workers by default (CI has 2 cores); PTEFARM_TEST_WORKERS=0 runs in one process.
exec python -m pytest -n "${PTEFARM_TEST_WORKERS:-2}" "$@"
