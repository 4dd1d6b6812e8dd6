#!/usr/bin/env bash
# Runs on the H200 machine (after scripts/h200-prepare.sh, carry=["carry"]): where one replayed
# batched decode step's GPU time goes, kernel by kernel. Nsight Compute measures every kernel
# of the STEP-th replayed step of NPL sequences (MUSER_NCU_STEP, the backend brackets that one
# graph launch with cuProfilerStart/Stop), one kernel at a time, caches not flushed, clocks left
# alone; tools/ncu/step.py sums the durations and DRAM bytes per kernel name.
# NPL (default 64), STEP (default 8), FLAGS (muser bench flags, default "--mode fast
# --fp8-weights"), ENVS (extra environment), TAG (log name).
source "$(dirname "$0")/h200-env.sh"
npl=${NPL:-64}
csv="$OUT/step-${TAG:-x$npl}.csv"
env ${ENVS:-} MUSER_NCU_STEP="$npl:${STEP:-8}" timeout ${NCU_TIMEOUT:-240} ncu --clock-control none \
  --cache-control none --profile-from-start off --csv --print-units base \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size \
  carry/bin/muser bench -m "$MODEL" --device cuda ${FLAGS:---mode fast --fp8-weights} -p 0 -n 0 \
  --parallel "$npl" --batch-gen $(( ${STEP:-8} + 4 )) > "$csv" 2> "$OUT/step-${TAG:-x$npl}.err"
python3 tools/ncu/step.py "$csv" | tee "$OUT/step-${TAG:-x$npl}.txt"
