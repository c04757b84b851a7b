#!/usr/bin/env bash
# Every reference bundle the main job and the tests use, exported into the cache ($PTEFARM_HOME/exports)
# before they need it, in two `farm export` processes at once (the 2 cores): each pays the imports of
# torch and ExecuTorch once for all its models, where each leg or test worker exporting its own paid
# them once per bundle, and two workers that needed one bundle at once both exported it. A bundle
# already in the cache costs a fraction of a second (no torch import). Called by ci/qualify.sh and
# ci/test.sh beside their other set-up, with .venv active.
# Balanced by measurement (2026-12-07, cold cache, 2 cores, each alone in its own process: tiny 38 s,
# tiny-stories 42 s, tiny-qwen2_5 ~40 s, small 57 s, tiny-smolvlm 42 s, tiny in 1.4.1's layout 40 s).
#   ci/export-bundles.sh          the main job's bundles (ci/qualify.sh)
#   ci/export-bundles.sh tests    the tests' (ci/test.sh): the same less small, which no test exports
# Exit code: the first failed export's (its output on stderr), 0 when every bundle is in the cache.
set -euo pipefail
case "${1:-main-job}" in
  main-job) second=(--model small --model tiny-smolvlm) ;;
  tests) second=(--model tiny-smolvlm) ;;
  *) echo "ci/export-bundles.sh: $1: not a set of bundles (main-job, tests)" >&2; exit 2 ;;
esac
logs=$(mktemp -d "${TMPDIR:-/tmp}/ptefarm-export.XXXXXX")
pids=()
# shellcheck disable=SC2329  # invoked by the trap
stop() {
  for pid in ${pids[@]+"${pids[@]}"}; do pkill -TERM -P "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
  rm -rf "$logs"
}
trap stop EXIT
trap 'exit 143' TERM INT  # a stopped job stops its exports (the EXIT trap)
farm export --model tiny --model tiny-qwen2_5 --model tiny-stories >"$logs/a" 2>&1 &
pids+=($!)
{ farm export "${second[@]}" && farm export --layout v1.4 --model tiny; } >"$logs/b" 2>&1 &
pids+=($!)
for i in "${!pids[@]}"; do
  code=0; wait "${pids[$i]}" || code=$?
  if [ "$code" -ne 0 ]; then
    grep -v '^farm export: \[' "$logs/$([ "$i" -eq 0 ] && echo a || echo b)" >&2 || true
    echo "ci/export-bundles.sh: exporting the reference bundles failed (exit $code; output above)" >&2
    exit "$code"
  fi
done
pids=()
