# Shared by ci/pr-gate.sh and ci/nightly.sh (sourced; they set $me first): their options, the SoC
# check, and running farm qualify so that a cancelled CI job still gets its partial report.
# shellcheck shell=bash
# The variables parse_options sets are the callers'; $me is theirs too.
# shellcheck disable=SC2034,SC2154

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
bad_usage() { echo "$me: $*" >&2; echo "usage: $me [--virtual] [--out DIR] [--bundle MANIFEST]" \
  "[--baseline NAME] [--baseline-bundle MANIFEST] [--min-effect PCT] [--inconclusive pass|fail] [--config FILE]" \
  "[--shard K/N [--group ID] [--shard-by soc|test]] [--dist soc|each] [SOC...]" \
  "[-- PYTEST_ARGS]  ($me --help)" >&2; exit 2; }

# Sets virtual, out, bundle, baseline, baseline_bundle, socs, passthrough (options farm qualify takes as they are) and
# pytest_args (everything after --).
parse_options() {
  virtual=0 out="" bundle=${PTEFARM_BUNDLE:-} baseline=${PTEFARM_BASELINE:-}
  baseline_bundle=${PTEFARM_BASELINE_BUNDLE:-}
  socs=() passthrough=() pytest_args=()
  while [ "$#" -gt 0 ]; do
    case "$1" in
      -h|--help) usage; exit 0 ;;
      --virtual) virtual=1 ;;
      --out|--bundle|--baseline|--baseline-bundle|--config|--min-effect|--inconclusive|--shard|--group|--shard-by|--dist)
        if [ "$#" -lt 2 ] || [ -z "$2" ]; then bad_usage "$1 needs a value"; fi
        case "$1" in
          --out) out=$2 ;; --bundle) bundle=$2 ;; --baseline) baseline=$2 ;;
          --baseline-bundle) baseline_bundle=$2 ;; *) passthrough+=("$1" "$2") ;;
        esac
        shift ;;
      --out=*) out=${1#*=} ;;
      --bundle=*) bundle=${1#*=} ;;
      --baseline=*) baseline=${1#*=} ;;
      --baseline-bundle=*) baseline_bundle=${1#*=} ;;
      --config=*|--min-effect=*|--inconclusive=*|--shard=*|--group=*|--shard-by=*|--dist=*) passthrough+=("$1") ;;
      --) shift; pytest_args=("$@"); break ;;
      -*) bad_usage "unknown option $1" ;;
      *) socs+=("$1") ;;
    esac
    shift
  done
  # A shard of a CI matrix: its group is the workflow run (every job of one run shares it, a re-run
  # attempt is a group of its own) unless --group says otherwise.
  local arg sharded=0 grouped=0
  for arg in ${passthrough[@]+"${passthrough[@]}"}; do
    case "$arg" in --shard|--shard=*) sharded=1 ;; --group|--group=*) grouped=1 ;; esac
  done
  if [ "$sharded" = 1 ] && [ "$grouped" = 0 ]; then
    [ -n "${GITHUB_RUN_ID:-}" ] || bad_usage "--shard needs --group ID (the id every shard of the run shares)"
    passthrough+=(--group "$GITHUB_RUN_ID-${GITHUB_RUN_ATTEMPT:-1}")
  fi
}

# A SoC name; SOC:N (N virtual devices) with --virtual.
check_socs() {
  local pattern soc
  if [ "$virtual" = 1 ]; then pattern='^[A-Za-z0-9]+(:[1-9][0-9]*)?$'; else pattern='^[A-Za-z0-9]+$'; fi
  for soc in "$@"; do
    [[ "$soc" =~ $pattern ]] || bad_usage "bad SoC '$soc' (a name like SM8650; SM8650:2 with --virtual)"
  done
}

# farm "$@", then the annotations; prints the HTML report's path last and exits with farm's code.
# farm runs in the background so that a signal to this script alone (a CI runner cancelling the job)
# still reaches it, as SIGTERM (a background job ignores SIGINT): farm then stops like on Ctrl-C,
# releases its leases and writes a partial report (exit 130).
run_farm() {
  echo "+ farm$(printf " %q" "$@")" >&2
  farm "$@" &
  farm_pid=$!
  trap 'kill -TERM "$farm_pid" 2>/dev/null || true' INT TERM
  while kill -0 "$farm_pid" 2>/dev/null; do wait "$farm_pid" || true; done
  local code=0
  wait "$farm_pid" || code=$?  # bash keeps the status of a reaped background job
  trap - INT TERM
  python ci/annotations.py "$out" --exit-code "$code" \
    || echo "$me: warning: ci/annotations.py failed; the report is in $out" >&2
  if [ -f "$out/report.html" ]; then
    realpath -- "$out/report.html"  # the last line: where the report is
  fi
  exit "$code"
}
