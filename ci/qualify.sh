#!/usr/bin/env bash
# The main job: parallel qualification runs on virtual Snapdragon devices (2 x SM8650, SM8550, SM8750;
# one pytest-xdist worker per device), one `farm qualify` each:
#   tiny          reference bundle: llama3, tiktoken tokenizer.model      -> reports/latest
#   tiny-qwen2_5  reference bundle: qwen2_5, HF tokenizer.json            -> reports/latest-tiny-qwen2_5
#   tiny-stories  reference bundle: llama2 (upstream's stories models), a llama2c tokenizer.bin
#                 exported from a SentencePiece model                   -> reports/latest-tiny-stories
#   upstream      tiny's programs under ExecuTorch v1.0.1's names         -> reports/latest-upstream
#                 (llama.py's artifact folder, the Android build folder with a qnn_llama_runner that
#                 shows v1.0.1's flags, a $QNN_SDK_ROOT: staged in .farm/qualify-upstream by
#                 farm/selftest/upstream.py with goldens from the host runner), `farm bundle create
#                 --dialect qnn-v1.0`d: driven with upstream's flags only, read from outputs.txt,
#                 inference_speed.txt and stdout
#   upstream-v1.4 tiny's programs exported in ExecuTorch 1.4.1's layout (kv_forward, prefill_forward,
#                 its metadata methods; farm export --layout v1.4) under 1.4.1's names, with a
#                 qnn_llama_runner that is v1.4.1's (--shared_buffer, no --kv_updater, 1.4.1's
#                 templates and observer line), `farm bundle create --dialect qnn-v1.4`d: SmartMask
#                 only, checked against goldens                             -> reports/latest-upstream-v1.4
#   tiny-smolvlm  reference vision-language bundle (smolvlm: vision encoder, token embedding, a text
#                 decoder of embeddings; farm/bundle/export_vlm.py), run by qnn_multimodal_runner v1.4.1
#                 as the host runner shows it: goldens of the float model per image and mode, the
#                 decoder's rates with the encoder's time apart        -> reports/latest-tiny-smolvlm
#   small         reference bundle with a KV cache of 4096 (upstream's SM8650 measurement), on two
#                 simulated SM8650s (--virtual-timing phone: every figure SIMULATED): the long-context
#                 cases (suites/data/long_context.toml: both updaters to the end of the 4096 context)
#                 and the throughput suite, whose relative rule (SmartMask not slower than ShiftPointer)
#                 is an A/B with an interval                                -> reports/latest-small
# (junit/<device>.xml, summary.md, results.json, report.md, report.html in each). Sets itself up on a
# fresh machine. The legs share their virtual devices: three sets are started once (`farm virtual up`,
# each with its own adb server and pool under a temporary directory, ended with the job and tied to
# this script's life: killed, it leaves none behind), a leg is `farm qualify --config` on one of
# them, and a leg's results are stored where a run's results go without this job (the configured
# pool's database: `farm history`). Extra arguments add to these defaults (e.g. --virtual SM8850
# adds a device to every set, -- -m gate); with --bundle MANIFEST or --model NAME only that bundle
# is qualified, on fresh devices of its own, into reports/latest.
# Exit code: the most serious of the runs' (130 interrupted, 2 bad input, 1 failures, 4 throughput
# regression, 3 infrastructure only, 0 qualified); an interrupted run stops the job.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
set_up_s=$SECONDS
# shellcheck disable=SC1091
. .venv/bin/activate
unset PYTHONDONTWRITEBYTECODE  # what this run imports is compiled once and kept (ci/setup.sh says why)
options=() pytest_args=() chosen=0
for arg in "$@"; do  # everything from `--` on goes to pytest, after our own options
  if [ "${#pytest_args[@]}" -gt 0 ] || [ "$arg" = "--" ]; then pytest_args+=("$arg"); else options+=("$arg"); fi
  case "$arg" in --bundle|--bundle=*|--model|--model=*) [ "${#pytest_args[@]}" -gt 0 ] || chosen=1 ;; esac
done

if [ "$chosen" -eq 1 ]; then  # one bundle on fresh virtual devices; set -e: its exit code is the job's
  farm qualify --out reports/latest --virtual SM8650:2 --virtual SM8550 --virtual SM8750 \
    ${options[@]+"${options[@]}"} ${pytest_args[@]+"${pytest_args[@]}"}
  exit 0
fi

# Our own options out of what goes to every leg: --virtual SOC[:N] adds devices to every set,
# --virtual-timing sets every set's timing. --config has no meaning here (the legs run on this
# job's devices): `farm qualify --config` qualifies on a configured farm.
extra_socs=() timing='' leg_options=()
set -- ${options[@]+"${options[@]}"}
while [ "$#" -gt 0 ]; do
  case "$1" in
    --virtual|--virtual-timing|--config) [ "$#" -ge 2 ] || { echo "ci/qualify.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in --virtual) extra_socs+=(--soc "$2") ;; --virtual-timing) timing=$2 ;;
        *) echo "ci/qualify.sh: --config: the main job runs on its own virtual devices; qualify on a configured farm with farm qualify --config" >&2; exit 2 ;;
      esac; shift 2 ;;
    --virtual=*) extra_socs+=(--soc "${1#*=}"); shift ;;
    --virtual-timing=*) timing=${1#*=}; shift ;;
    --config=*) echo "ci/qualify.sh: --config: the main job runs on its own virtual devices" >&2; exit 2 ;;
    *) leg_options+=("$1"); shift ;;
  esac
done
# Where the legs' results are stored: where a run's go without this job (the configured pool's
# database, farm.results.store), not the job's own pools, which end with it.
results_url=$(python -c 'from farm.config import load_config; from farm.results.store import results_url; print(results_url(load_config()))')
to_pytest=(-- --farm-results-url "$results_url")  # before the caller's: a --farm-results-url of theirs wins
if [ "${#pytest_args[@]}" -gt 0 ]; then to_pytest+=("${pytest_args[@]:1}"); fi

state=$(mktemp -d "${TMPDIR:-/tmp}/ptefarm-qualify.XXXXXX")
sets=() exports=()
# shellcheck disable=SC2329  # invoked by the trap
end_job() {
  for pid in ${exports[@]+"${exports[@]}"}; do kill "$pid" 2>/dev/null || true; done  # still exporting
  for name in ${sets[@]+"${sets[@]}"}; do farm virtual down --config "$state/$name.toml" >/dev/null 2>&1 || true; done
  rm -rf "$state"
}
trap end_job EXIT

device_set() {  # NAME TIMING SOC[:N]...: virtual devices with their own adb server and pool, for `farm qualify --config $state/NAME.toml`
  local name=$1 set_timing=$2 socs=(); shift 2
  for soc in "$@"; do socs+=(--soc "$soc"); done
  mkdir -p "$state/$name"
  printf '[farm]\nhome = "%s"\n[pool]\nurl = "sqlite:///%s"\n' "$state/$name" "$state/$name/pool.db" >"$state/$name.toml"
  sets+=("$name")
  farm virtual up --config "$state/$name.toml" "${socs[@]}" ${extra_socs[@]+"${extra_socs[@]}"} \
    --timing "${timing:-$set_timing}" --exit-with-pid $$ >"$state/$name.up.log" 2>&1 \
    || { cat "$state/$name.up.log" >&2; echo "ci/qualify.sh: cannot start the $name devices" >&2; exit 3; }
}
# Every bundle the legs qualify, exported before them beside the devices' start (ci/export-bundles.sh
# says why): a leg whose bundle is cached imports no torch. Its failure is the job's: every leg of that
# bundle would fail on it anyway.
ci/export-bundles.sh &
exports=($!)
# One set per lane (its legs run one after another); `small` is measured on simulated phones.
device_set lane-a host SM8650:2 SM8550 SM8750
device_set lane-b host SM8650:2 SM8550 SM8750
device_set phone phone SM8650:2
code=0; wait "${exports[0]}" || code=$?
exports=()
[ "$code" -eq 0 ] || exit "$code"
echo "ci/qualify.sh: set-up ${set_up_s} s; bundles exported and devices up $((SECONDS - set_up_s)) s later" >&2

qualify() {  # SET OUT [options...]: one farm qualify on a set's devices
  local set=$1 out=$2; shift 2
  farm qualify --config "$state/$set.toml" --out "$out" "$@" ${leg_options[@]+"${leg_options[@]}"} "${to_pytest[@]}"
}

upstream_bundle() {  # DIR LAYOUT DIALECT NAME: stage upstream's folders from the tiny export, `farm bundle create` them
  local dir=$1 layout=$2 dialect=$3 name=$4 args
  rm -rf "$dir"  # staged anew by each run
  args=$(python -m farm.selftest.upstream "$dir/folders" --model tiny --layout "$layout" \
    --goldens "$dir/bundle/goldens.toml") || return
  mapfile -t args <<<"$args"  # --artifact, --build-folder, --qnn-sdk, --htp-arch ..., one per line
  farm bundle create "$dir/bundle/manifest.json" --name "$name" --dialect "$dialect" \
    "${args[@]}"  # it warns that a phone could load none of the stand-ins
}

rank() { case "$1" in 0) echo 0 ;; 3) echo 1 ;; 4) echo 2 ;; 1) echo 3 ;; 2) echo 4 ;; *) echo 5 ;; esac; }

# The legs run in two lanes at once. The job is CPU-bound on 2 cores (vmstat: no idle while one leg
# runs; the virtual devices' zygotes, shells and sync workers are most of it, outside the farm
# command's own time): three lanes took 6 min 30 s where two take 6 min 17 s (2026-12-07, exports
# cached). Each leg's output goes to its log, printed whole when the leg ends, so that the two runs'
# lines never interleave.
interrupted=0
# shellcheck disable=SC2329  # invoked by the trap
stop_legs() {  # a signal to this script alone (a CI cancel) reaches every running farm qualify
  interrupted=1
  for f in "$state"/*.pid; do [ -e "$f" ] && kill -INT "$(cat "$f")" 2>/dev/null; done
  return 0
}
trap stop_legs INT TERM

leg() {  # SET MODEL: one qualification on a set's devices; its exit code in $state/MODEL.code
  local set=$1 model=$2 out=reports/latest code=0 start=$SECONDS
  [ "$model" = tiny ] || out=reports/latest-$model
  mkdir -p reports
  {
    if [ "$model" = upstream ] || [ "$model" = upstream-v1.4 ]; then
      local dir=.farm/qualify-$model layout=v1.0 dialect=qnn-v1.0
      [ "$model" = upstream ] || { layout=v1.4; dialect=qnn-v1.4; }
      if upstream_bundle "$dir" "$layout" "$dialect" "$model-tiny"; then
        qualify "$set" "$out" --bundle "$dir/bundle/manifest.json" &
      else c=$?; (exit "$c") & fi
    elif [ "$model" = small ]; then  # the long-context cases too (this leg's own to_pytest, which qualify reads)
      local to_pytest=("${to_pytest[@]}" --farm-cases suites/data/long_context.toml)
      qualify "$set" "$out" --model small &
    else
      qualify "$set" "$out" --model "$model" &
    fi
    echo $! >"$state/$model.pid"
    wait $! || code=$?
  } >"$state/$model.log" 2>&1
  rm -f "$state/$model.pid"
  cat "$state/$model.log"
  echo "ci/qualify.sh: $model -> $out: exit $code in $((SECONDS - start)) s" >&2
  echo "$code" >"$state/$model.code"
  [ "$code" -ne 130 ]
}

lane() {  # SET MODEL...: one after another on a set's devices (small: on the simulated phones);
  # an interrupted leg ends the lane
  local set=$1; shift
  for model in "$@"; do
    if [ "$model" = small ]; then leg phone small || return 0; else leg "$set" "$model" || return 0; fi
  done
}

# Balanced by measurement (2026-12-07, exports cached, devices shared: small 96 s, upstream 50 s,
# tiny-stories 36 s; tiny 65 s, tiny-qwen2_5 58 s, upstream-v1.4 38 s, tiny-smolvlm 14 s).
lane lane-a small upstream tiny-stories &
lanes=($!)
lane lane-b tiny tiny-qwen2_5 upstream-v1.4 tiny-smolvlm &
lanes+=($!)
for pid in "${lanes[@]}"; do  # a trapped signal ends a wait early: wait again until the lane ends
  while kill -0 "$pid" 2>/dev/null; do wait "$pid" || true; done
done
worst=0
for f in "$state"/*.code; do
  [ -e "$f" ] || continue
  code=$(cat "$f")
  if [ "$(rank "$code")" -gt "$(rank "$worst")" ]; then worst=$code; fi
done
[ "$interrupted" -eq 0 ] || [ "$(rank "$worst")" -ge 5 ] || worst=130
exit "$worst"
