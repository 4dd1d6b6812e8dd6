#!/usr/bin/env bash
# On the GPU machine (after scripts/h200-prepare.sh here, carry=["carry"]): the accurate mode's
# split f16 products in column runs (GEMM16_RUN_COLUMNS, docs/PARITY.md): gpu.rs's tests named
# in TESTS (default split_f16_products_in_column_runs_meet_the_bound), then the accurate mode's
# prompts on the synthetic 30B with the run lengths in KCHUNKS (MUSER_GEMM16_KCHUNK; 0: one run)
# alternating.
set -uo pipefail
[ -f carry/bin.tar.xz ] && tar -C carry -xJf carry/bin.tar.xz
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export MUSER_KERNEL_CACHE=/tmp/muser-kernels
MODEL=${MODEL:-/tmp/muse-30b-q4_k_m.gguf}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
MUSER_FIXTURES=tests/fixtures timeout 300 carry/bin/gpu-tests ${TESTS:-split_f16_products} --nocapture --test-threads 1 > "$OUT/gpu-tests.log" 2>&1
grep -E "runs of|test result|panicked|FAILED|^test " "$OUT/gpu-tests.log"
[ -f "$MODEL" ] || carry/bin/muser synth "$MODEL" --preset 30b --layout q4_k_m > "$OUT/synth.log" 2>&1
for k in ${KCHUNKS:-0 4096 0 4096}; do
  MUSER_GEMM16_KCHUNK=$k carry/bin/muser bench -m "$MODEL" --device cuda -p ${PP:-512,2048} -n 0 -r 2 2>&1 | grep -E "^\| pp" | sed "s/^/runs $k /"
done | tee "$OUT/bench.log"
