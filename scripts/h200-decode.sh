#!/usr/bin/env bash
# One-sequence decode on the H200 machine (after scripts/h200-prepare.sh, carry=["carry/bin"]):
# `muser bench` decode for the default and each of DVARIANTS (space-separated, each one or more
# comma-separated VAR=VALUE, e.g. "MUSER_MVQ_SPLIT=0 MUSER_MMQ_PAIR=0"), then (NCU=1) every kernel
# of two replayed decode steps timed by Nsight Compute (graph nodes one by one, clocks left alone),
# summed per kernel name (tools/ncu/step.py): where a token's time goes inside the graph, without the
# events' overhead. NCU_CACHE=none keeps the caches between kernels (ncu flushes them by default).
source "$(dirname "$0")/h200-env.sh"
B="carry/bin/muser bench -m $MODEL --device cuda -p 0 -n ${TG:-128} -r ${REPS:-3}"
log="$OUT/decode.log"
[ -n "${ONLY_NCU:-}" ] || timeout 200 $B 2>&1 | grep -E '^\| tg' | sed 's/^| /| (default) /' | tee -a "$log"
for v in ${DVARIANTS:-}; do
  env ${v//,/ } timeout 200 $B 2>&1 | grep -E '^\| tg' | sed "s/^| /| ($v) /" | tee -a "$log"
done
if [ -n "${NCU:-}" ]; then
  # A decode step is ~450 launches; skip the load and the first steps, profile about two steps.
  timeout ${NCU_TIMEOUT:-240} ncu --clock-control none --cache-control ${NCU_CACHE:-all} --graph-profiling node --csv --print-units base \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size \
    --launch-skip ${SKIP:-6000} --launch-count ${COUNT:-900} \
    carry/bin/muser bench -m "$MODEL" --device cuda -p 0 -n 64 -r 1 > /tmp/ncu-decode.csv 2> /tmp/ncu-decode.err
  python3 tools/ncu/step.py /tmp/ncu-decode.csv | tee -a "$log"
  tail -3 /tmp/ncu-decode.err
fi
