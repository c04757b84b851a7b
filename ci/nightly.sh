#!/usr/bin/env bash
# The nightly qualification, and the release qualification with PTEFARM_PURPOSE=release: the farm's full
# suites (smoke, correctness, throughput) on every SoC of the farm's configured pool (farm.toml /
# $PTEFARM_CONFIG), `farm qualify --purpose nightly|release`, throughput gated against a named baseline.
#
#   ci/nightly.sh [--virtual] [--out DIR] [--bundle MANIFEST] [--baseline NAME] [--min-effect PCT]
#                 [--inconclusive pass|fail] [--config FILE] [--shard K/N [--group ID] [--shard-by soc|test]]
#                 [--dist soc|each] [SOC...] [-- PYTEST_ARGS]
#
# SoCs: the arguments, else every SoC the pool has. --virtual is a dry run on fresh virtual devices
# (the arguments as SOC[:N], default SM8650:2 SM8550 SM8750) behind a private adb server and pool.
# Baseline: --baseline, else $PTEFARM_BASELINE, else the latest named baseline of the bundle
# (`farm baseline set RUN --name v1.0`); "none" gates on the thresholds only.
# Reports land in --out [default: reports/<purpose>-<UTC date-time>]: junit/<device>.xml, summary.md,
# results.json, report.md, report.html. Then ci/annotations.py prints failures as GitHub annotations
# (infrastructure errors as warnings titled so) and appends report.md to $GITHUB_STEP_SUMMARY if set.
# The last line is the HTML report's path. Environment: PTEFARM_PURPOSE (nightly, the default, or
# release), PTEFARM_BUNDLE (a manifest, default the reference bundle farm exports), PTEFARM_BASELINE.
# --config, --min-effect, --inconclusive, --shard, --group, --shard-by and --dist go to farm qualify as
# they are (--dist each: every test on every device of each SoC). Paths are relative to the repository
# root. A CI matrix runs one shard per job (--shard K/N, the group defaulting to
# $GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT) and a last job merges them into one release
# report: `farm report merge --group ID` or `farm report merge SHARD_DIR...`.
#
# Exit code (farm/exitcodes.py): 0 qualified, 1 test failures, 2 bad usage, 3 infrastructure only,
# 4 throughput regression, 130 interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
me=ci/nightly.sh

# shellcheck source=ci/lib.sh
. ci/lib.sh

purpose=${PTEFARM_PURPOSE:-nightly}
case "$purpose" in
  nightly|release) ;;
  *) bad_usage "PTEFARM_PURPOSE must be nightly or release, got '$purpose'" ;;
esac
parse_options "$@"
check_socs ${socs[@]+"${socs[@]}"}
if [ "$virtual" = 1 ] && [ "${#socs[@]}" -eq 0 ]; then
  socs=(SM8650:2 SM8550 SM8750)  # ci/qualify.sh's devices
fi

ci/setup.sh || { echo "$me: set-up failed (ci/setup.sh): infrastructure" >&2; exit 3; }
# shellcheck disable=SC1091
. .venv/bin/activate

out=${out:-reports/$purpose-$(date -u +%Y%m%d-%H%M%S)}
args=(qualify --purpose "$purpose" --priority "$purpose" --out "$out")
for soc in ${socs[@]+"${socs[@]}"}; do
  if [ "$virtual" = 1 ]; then args+=(--virtual "$soc"); else args+=(--soc "$soc"); fi
done
[ -z "$bundle" ] || args+=(--bundle "$bundle")
[ -z "$baseline" ] || args+=(--baseline "$baseline")  # else farm qualify takes the latest named one
args+=(${passthrough[@]+"${passthrough[@]}"})
[ "${#pytest_args[@]}" -eq 0 ] || args+=(-- "${pytest_args[@]}")
echo "$me: $purpose qualification on ${socs[*]:-every SoC of the pool}$([ "$virtual" = 1 ] &&
  echo ' (virtual devices)'), config ${PTEFARM_CONFIG:-./farm.toml if present}," \
  "baseline ${baseline:-the latest named one}" >&2
run_farm "${args[@]}"
