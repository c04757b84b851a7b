#!/usr/bin/env bash
# Mutation testing of the verdict paths ([tool.mutmut] in pyproject.toml): every mutant of those modules
# against the fast tests that reach it; prints the score per module and every surviving mutant.
# Not part of ci/test.sh (it takes minutes); run it when a verdict path or its tests change.
#   ci/mutation.sh                          every module
#   ci/mutation.sh farm.execute.compare     only that module's mutants (any mutmut name glob works)
# mutmut comes with the dev extras (ci/setup.sh). ci/mutmut_cli.py is mutmut with SQL's case mutants left out (equivalent by definition: see there).
# PTEFARM_MUTATION_JOBS sets the parallel children (default 4: on 2 cores, half of a mutant's time is
# waiting on subprocesses, disk and bounded waits, and 2 children left the CPU half idle);
# MUTATION_REPORT_ARGS=--diffs prints diffs.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ci/start-postgres.sh >/dev/null
export PTEFARM_TEST_PG_URL=${PTEFARM_TEST_PG_URL-postgresql://postgres@127.0.0.1:5432/test}
export PTEFARM_HOME=${PTEFARM_TEST_HOME:-$PWD/.farm/test-home}
# A test's bound on what should happen at once (tests/support/pool.py): each mutant that breaks a
# heartbeat or a grant pays it before it counts as killed. 5 s is still hundreds of times what it takes.
export PTEFARM_TEST_PROMPT_S=${PTEFARM_TEST_PROMPT_S:-5}
rm -rf mutants  # mutmut resumes from mutants/; a fresh copy measures the tree as it is
globs=()
for m in "$@"; do
  case "$m" in *'*'*) globs+=("$m") ;; *) globs+=("$m.*") ;; esac
done
started=$(date +%s)
python ci/mutmut_cli.py run --max-children "${PTEFARM_MUTATION_JOBS:-4}" "${globs[@]}" >mutants.log 2>&1 || true
echo "mutation run: $(( $(date +%s) - started )) s (mutmut's output: mutants.log)"
# shellcheck disable=SC2086
python ci/mutation_report.py ${MUTATION_REPORT_ARGS:-}
