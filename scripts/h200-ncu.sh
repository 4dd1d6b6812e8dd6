#!/usr/bin/env bash
# Nsight Compute on the tensor-core products of a 64-sequence batched step (run on the H200 machine
# after scripts/h200-prepare.sh, carry=["carry"]): the kernels' launches of layer 0 (one decode
# token per sequence), speed of light, occupancy and the warps' stall reasons per issued instruction.
# KERNEL (default mmq_s_q4_k_4), SKIP / COUNT (launches of it to skip / to profile), ENVS (extra
# environment for muser, e.g. "MUSER_MMQ_NT=2"), NPL (sequences, default 64), FLAGS (muser bench flags,
# default none: the accurate mode).
source "$(dirname "$0")/h200-env.sh"
log="$OUT/ncu-${TAG:-stalls}.log"
env ${ENVS:-} timeout ${NCU_TIMEOUT:-200} ncu --clock-control none --kernel-name "${KERNEL:-mmq_s_q4_k_4}" \
  --launch-skip ${SKIP:-3} --launch-count ${COUNT:-4} \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
  carry/bin/muser bench -m "$MODEL" --device cuda ${FLAGS:-} -p 0 -n 0 --parallel ${NPL:-64} --batch-prompt 1 --batch-gen 1 > "$log" 2>&1
grep -E "^  [a-z_0-9]+ \(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Eligible Warps|Issued Warp|Shared Memory Config|stalled_[a-z_]+_per_issue_active.ratio" "$log" |
  awk '!/stalled/ || $NF+0 >= 0.05'
