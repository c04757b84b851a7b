#!/usr/bin/env bash
# The release report of a sharded qualification: the shard runs of one group (ci/nightly.sh --shard K/N,
# one CI job each) merged into one run by `farm report merge`: report.html, report.md, junit/<device>.xml,
# summary.md, results.json and benchmark-v3.json in --out, one verdict over every shard, the group run
# stored in the results history (run group-ID).
#
#   ci/merge.sh --out DIR [--group ID] [SHARD_DIR...]
#
# SHARD_DIR: the shards' report directories (CI artifacts). --group ID also takes, from the results
# store, each shard of the group that no SHARD_DIR holds; a shard found nowhere is named missing and
# its tests are infrastructure errors in the report. Baseline: $PTEFARM_BASELINE, else the latest named
# baseline of the bundle for nightly and release runs. Then ci/annotations.py prints failures as GitHub
# annotations and appends report.md to $GITHUB_STEP_SUMMARY if set. The last line is the HTML report's
# path.
#
# Exit code (farm/exitcodes.py): 0 qualified, 1 test failures, 2 bad usage (shards of different runs),
# 3 infrastructure only (a shard missing), 4 throughput regression, 130 interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
me=ci/merge.sh

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
bad_usage() { echo "$me: $*" >&2; echo "usage: $me --out DIR [--group ID] [SHARD_DIR...]  ($me --help)" >&2; exit 2; }

out="" args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --out|--group)
      if [ "$#" -lt 2 ] || [ -z "$2" ]; then bad_usage "$1 needs a value"; fi
      if [ "$1" = --out ]; then out=$2; else args+=(--group "$2"); fi
      shift ;;
    -*) bad_usage "unknown option $1" ;;
    *) args+=("$1") ;;
  esac
  shift
done
[ -n "$out" ] || bad_usage "--out DIR is required"
[ "${#args[@]}" -gt 0 ] || bad_usage "no shard: give SHARD_DIR... or --group ID"

ci/setup.sh || { echo "$me: set-up failed (ci/setup.sh): infrastructure" >&2; exit 3; }
# shellcheck disable=SC1091
. .venv/bin/activate

cmd=(report merge --out "$out" "${args[@]}")
[ -z "${PTEFARM_BASELINE:-}" ] || cmd+=(--baseline "$PTEFARM_BASELINE")
echo "+ farm$(printf " %q" "${cmd[@]}")" >&2
code=0
farm "${cmd[@]}" >&2 || code=$?
python ci/annotations.py "$out" --exit-code "$code" \
  || echo "$me: warning: ci/annotations.py failed; the report is in $out" >&2
if [ -f "$out/report.html" ]; then
  realpath -- "$out/report.html"  # the last line: where the report is
fi
exit "$code"
