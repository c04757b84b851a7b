#!/usr/bin/env bash
# The pull-request gate: the `gate` subset of the farm's suites on the SoCs a pull request must pass,
# leased from the farm's configured pool (farm.toml / $PTEFARM_CONFIG), `farm qualify --purpose pr`.
#
#   ci/pr-gate.sh [--virtual] [--out DIR] [--bundle MANIFEST] [--baseline NAME]
#                 [--baseline-bundle MANIFEST] [--min-effect PCT] [--inconclusive pass|fail]
#                 [--config FILE] [SOC...] [-- PYTEST_ARGS]
#
# SoCs: the arguments, else $PTEFARM_GATE_SOCS ("SM8650,SM8750"), else ci/gate.toml's [gate] socs
# ($PTEFARM_GATE_CONFIG names another file). --virtual is a dry run: one fresh virtual device per SoC
# (SOC:N for N of them) behind a private adb server and pool instead of the farm's phones.
# Reports land in --out [default: reports/pr-<UTC date-time>]: junit/<device>.xml, summary.md,
# results.json, report.md, report.html. Then ci/annotations.py prints failures as GitHub annotations
# (infrastructure errors as warnings titled so) and appends report.md to $GITHUB_STEP_SUMMARY if set.
# The last line is the HTML report's path. Environment: PTEFARM_BUNDLE (a manifest, default the reference
# bundle farm exports), PTEFARM_BASELINE (a named baseline to gate throughput against; default none),
# PTEFARM_BASELINE_BUNDLE (= --baseline-bundle: the main branch's bundle manifest; the gate then A/Bs
# the pull request's bundle against it on each leased phone, in interleaved blocks until the interval
# decides, and test_against_baseline_bundle fails when the pull request's bundle is slower: the
# comparison a stored baseline from another day and maybe another phone cannot make).
# --config, --min-effect and --inconclusive go to farm qualify as they are.
#
# Exit code (farm/exitcodes.py): 0 qualified, 1 test failures, 2 bad usage, 3 infrastructure only,
# 4 throughput regression, 130 interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
me=ci/pr-gate.sh

# shellcheck source=ci/lib.sh
. ci/lib.sh

parse_options "$@"
if [ "${#socs[@]}" -eq 0 ] && [ -n "${PTEFARM_GATE_SOCS:-}" ]; then
  read -r -a socs <<<"${PTEFARM_GATE_SOCS//,/ }"
fi

ci/setup.sh || { echo "$me: set-up failed (ci/setup.sh): infrastructure" >&2; exit 3; }
# shellcheck disable=SC1091
. .venv/bin/activate

gate_config=${PTEFARM_GATE_CONFIG:-ci/gate.toml}
gate=$(python - "$gate_config" <<'EOF'
import sys, tomllib
path = sys.argv[1]
try:
    with open(path, "rb") as f:
        gate = tomllib.load(f).get("gate", {})
except (OSError, tomllib.TOMLDecodeError) as e:
    sys.exit(f"{path}: {e}")
socs, marker = gate.get("socs", []), gate.get("marker", "gate")
if not (isinstance(socs, list) and all(isinstance(s, str) for s in socs)
        and isinstance(marker, str) and marker.strip()):
    sys.exit(f"{path}: [gate] socs must be a list of SoC names and marker a pytest -m expression")
print(*socs)  # the first line, maybe empty
print(marker)
EOF
) || bad_usage "cannot read the gate config $gate_config"
marker=${gate#*$'\n'}
if [ "${#socs[@]}" -eq 0 ]; then
  read -r -a socs <<<"${gate%%$'\n'*}"
fi
[ "${#socs[@]}" -gt 0 ] || bad_usage "no SoC to gate on (arguments, PTEFARM_GATE_SOCS or $gate_config)"
check_socs "${socs[@]}"

out=${out:-reports/pr-$(date -u +%Y%m%d-%H%M%S)}
args=(qualify --purpose pr --priority pr --out "$out")
for soc in "${socs[@]}"; do
  if [ "$virtual" = 1 ]; then args+=(--virtual "$soc"); else args+=(--soc "$soc"); fi
done
[ -z "$bundle" ] || args+=(--bundle "$bundle")
[ -z "$baseline" ] || args+=(--baseline "$baseline")
[ -z "$baseline_bundle" ] || args+=(--ab-baseline "$baseline_bundle")
args+=(${passthrough[@]+"${passthrough[@]}"})
args+=(-- -m "$marker" ${pytest_args[@]+"${pytest_args[@]}"})
echo "$me: gate on ${socs[*]}$([ "$virtual" = 1 ] && echo ' (virtual devices)'), config" \
  "${PTEFARM_CONFIG:-./farm.toml if present}, A/B against ${baseline_bundle:-no baseline bundle}" >&2
run_farm "${args[@]}"
