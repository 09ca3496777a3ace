#!/usr/bin/env bash
# Every benchmark of benchmarks/README.md, one after the other: `make bench-all` (the
# measurement; about 3 hours on a quiet 2-core machine) or `make bench-quick` (smoke runs
# at reduced scale, which decide nothing: --quick).
# Each benchmark's output goes to $OUT/<name>.log; $OUT/summary.txt gets one line per
# benchmark: its exit status, wall time, the load average before it, and its RESULT line.
# A benchmark that fails (exit status 1: a failed check or a missed target) does not stop
# the others. Run it on a quiet machine: load average under 1 at the start.
# ONLY="plan_ranking ddp_vs_torchrun" runs those alone (the 3 hours split over quiet
# windows); its summary then goes to summary-<first name>.txt.
set -u
cd "$(dirname "$0")"
PYTHON=${PYTHON:-../.venv/bin/python}
OUT=${OUT:-../bench-results}
QUICK=${1:-}
mkdir -p "$OUT"
ONLY=${ONLY:-}
SUMMARY="$OUT/summary${QUICK:+-quick}${ONLY:+-${ONLY%% *}}.txt"
: > "$SUMMARY"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) (want < 1)" | tee -a "$SUMMARY"

run() {  # run NAME ARGS...: one benchmark, logged and summarised
  local name=$1
  shift
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then
    return
  fi
  local load began status
  load=$(cut -d' ' -f1 /proc/loadavg)
  began=$(date +%s)
  echo "== $name $* (load $load)"
  "$PYTHON" "$@" $QUICK > "$OUT/$name.log" 2>&1
  status=$?
  local result
  result=$(grep '^RESULT ' "$OUT/$name.log" | tail -1)
  printf '%-22s exit %d  %5d s  load %s  %s\n' "$name" "$status" \
    $(( $(date +%s) - began )) "$load" "${result:-NO RESULT LINE}" | tee -a "$SUMMARY"
}

run sched_vs_pollux sched_vs_pollux.py
run xgboost_vs_peers xgboost_vs_peers.py
run ddp_vs_torchrun ddp_vs_torchrun.py
run elastic_recovery elastic_recovery.py
run multi_job multi_job.py
run tune_asha tune_asha.py
# the planner's links calibrated in one invocation, the sweep priced with them in another
run ps_calibration ps_vs_allreduce.py --calibrate-only --calibration "$OUT/ps-links.json"
run ps_vs_allreduce ps_vs_allreduce.py --calibration "$OUT/ps-links.json"
run heterogeneous heterogeneous.py
run plan_ranking plan_ranking.py
run adaptive_batch adaptive_batch.py
echo "summary: $SUMMARY"
