#!/usr/bin/env bash
# Nsight Compute on matrix-vector variants of mvbench.py (GPU machine, repo root):
#   bash tools/mvbench/ncu.sh SHAPE KERNEL...
shape=$1; shift
for k in "$@"; do
  echo "=== $k ($shape)"
  ncu --kernel-name "$k" --launch-skip 5 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats \
    python3 tools/mvbench/mvbench.py "$shape" 2>&1 | grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|No Eligible|Active Warps Per|Eligible Warps|Issued Warp|Executed Ipc Active|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Mem Pipes Busy|Stall|Issue Slots Busy|SM Busy|est. speedup|This kernel|is stalled|on average" | head -40
done
