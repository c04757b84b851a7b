#!/usr/bin/env bash
# The main job: parallel qualification runs of both reference bundles on virtual Snapdragon devices
# (2 x SM8650, SM8550, SM8750; one pytest-xdist worker per device), one `farm qualify` each:
#   tiny          llama3, tiktoken tokenizer.model   -> reports/latest
#   tiny-qwen2_5  qwen2_5, HF tokenizer.json         -> reports/latest-tiny-qwen2_5
# (junit/<device>.xml, summary.md, results.json, report.md, report.html in each). Sets itself up on a
# fresh machine. Extra arguments add to these defaults (e.g. --virtual SM8850, -- -m gate); with
# --bundle MANIFEST or --model NAME only that bundle is qualified, into reports/latest.
# Exit code: the most serious of the runs' (130 interrupted, 2 bad input, 1 failures, 4 throughput
# regression, 3 infrastructure only, 0 qualified); an interrupted run stops the job.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
options=() pytest_args=() chosen=0
for arg in "$@"; do  # everything from `--` on goes to pytest, after our own options
  if [ "${#pytest_args[@]}" -gt 0 ] || [ "$arg" = "--" ]; then pytest_args+=("$arg"); else options+=("$arg"); fi
  case "$arg" in --bundle|--bundle=*|--model|--model=*) [ "${#pytest_args[@]}" -gt 0 ] || chosen=1 ;; esac
done

qualify() {  # OUT [options...]: one farm qualify on fresh virtual devices
  local out=$1; shift
  farm qualify --out "$out" --virtual SM8650:2 --virtual SM8550 --virtual SM8750 "$@" \
    ${options[@]+"${options[@]}"} ${pytest_args[@]+"${pytest_args[@]}"}
}

if [ "$chosen" -eq 1 ]; then
  qualify reports/latest  # set -e: its exit code is the job's
  exit 0
fi

rank() { case "$1" in 0) echo 0 ;; 3) echo 1 ;; 4) echo 2 ;; 1) echo 3 ;; 2) echo 4 ;; *) echo 5 ;; esac; }
worst=0
for model in tiny tiny-qwen2_5; do
  out=reports/latest
  [ "$model" = tiny ] || out=reports/latest-$model
  code=0 start=$SECONDS
  qualify "$out" --model "$model" || code=$?
  echo "ci/qualify.sh: $model -> $out: exit $code in $((SECONDS - start)) s" >&2
  if [ "$(rank "$code")" -gt "$(rank "$worst")" ]; then worst=$code; fi
  if [ "$code" -eq 130 ]; then break; fi
done
exit "$worst"
