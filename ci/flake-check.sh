#!/usr/bin/env bash
# Runs every test marked `statistical` (the ones that judge the simulated phone's figures) N times in a
# row, 50 by default, and fails if any run fails: shows they never flake (issue 38). Each round is a new
# pytest session, so nothing a round leaves (heat, run indexes, ports, pids) may change a verdict.
#   ci/flake-check.sh [-n ROUNDS] [PYTEST_ARGS...]     e.g. ci/flake-check.sh -n 5 -k ab
# Prints one line a round and, at the end, the failures with the rounds they failed in.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=50
if [ "${1:-}" = "-n" ]; then rounds=$2; shift 2; fi
case "$rounds" in ''|*[!0-9]*) echo "ci/flake-check.sh: -n takes a whole number, got '$rounds'" >&2; exit 2 ;; esac
ci/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ci/start-postgres.sh
export PTEFARM_TEST_PG_URL=${PTEFARM_TEST_PG_URL-postgresql://postgres@127.0.0.1:5432/test}
export PTEFARM_HOME=${PTEFARM_TEST_HOME:-$PWD/.farm/test-home}
log=$(mktemp -d "${TMPDIR:-/tmp}/ptefarm-flake.XXXXXX")
trap 'rm -rf "$log"' EXIT
failed_rounds=0
for i in $(seq 1 "$rounds"); do
  start=$SECONDS
  if python -m pytest -q -p no:cacheprovider -m statistical -n "${PTEFARM_TEST_WORKERS:-2}" \
      -p no:randomly -rf "$@" >"$log/round" 2>&1; then
    echo "round $i/$rounds: passed ($(tail -1 "$log/round" | sed 's/=//g;s/^ *//;s/ *$//'), $((SECONDS - start)) s)"
  else
    failed_rounds=$((failed_rounds + 1))
    echo "round $i/$rounds: FAILED ($((SECONDS - start)) s)"
    grep '^FAILED\|^ERROR' "$log/round" | sed "s/^/  round $i: /" | tee -a "$log/failures"
    if ! grep -q '^FAILED\|^ERROR' "$log/round"; then tail -20 "$log/round"; fi
  fi
done
if [ "$failed_rounds" -gt 0 ]; then
  echo "ci/flake-check.sh: $failed_rounds of $rounds rounds failed:" >&2
  sort "$log/failures" >&2 || true
  exit 1
fi
echo "ci/flake-check.sh: $rounds of $rounds rounds passed"
