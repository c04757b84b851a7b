#!/usr/bin/env bash
# The project's tests, on a fresh machine or a used one: set-up, services, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
unset PYTHONDONTWRITEBYTECODE  # what this run imports is compiled once and kept (ci/setup.sh says why)
# Tests never touch the user's farm state: their own home (bundle cache included, kept between runs).
# Their reference bundles are exported into it beside the rest of the set-up (ci/export-bundles.sh says
# why: two workers no longer export one bundle at once, each paying torch's imports).
export PTEFARM_HOME=${PTEFARM_TEST_HOME:-$PWD/.farm/test-home}
ci/export-bundles.sh tests &
exports=$!
trap 'kill "$exports" 2>/dev/null || true' EXIT
ci/start-postgres.sh
# The report tests render the HTML report in Debian's headless chromium.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "ci/test.sh: installing chromium (headless rendering of the HTML report) ..." >&2
  apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
fi
# The adb-over-SSH tests start an OpenSSH server of their own on 127.0.0.1 (Debian's openssh-server);
# as root, sshd needs its privilege separation directory, which a service manager would make.
if ! [ -x /usr/sbin/sshd ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "ci/test.sh: installing openssh-server (the tests' SSH-reached adb server) ..." >&2
  apt-get install -y -q openssh-server openssh-client >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q openssh-server openssh-client >/dev/null; }
fi
if [ -x /usr/sbin/sshd ] && [ "$(id -u)" = 0 ] && [ ! -d /run/sshd ]; then
  mkdir -m 0755 /run/sshd
fi
export PTEFARM_TEST_PG_URL=${PTEFARM_TEST_PG_URL-postgresql://postgres@127.0.0.1:5432/test}
wait "$exports"  # set -e: a failed export is the run's failure, its output on stderr
trap - EXIT
# Two workers by default (CI has 2 cores); PTEFARM_TEST_WORKERS=0 runs in one process.
exec python -m pytest -n "${PTEFARM_TEST_WORKERS:-2}" "$@"
