#!/usr/bin/env bash
# On the GPU machine (after scripts/h200-prepare.sh here, carry=["carry"]): prompts in micro-batches
# of each size in UBS (default "512 2048"), Muser and llama.cpp b11434 (llama-bench -ub N) on the
# same synthetic 30B file in the same call: the accurate mode (-p PP), then --mode fast
# --fp8-weights (-p 2048, with decode tg128 beside it), then llama-bench; last, where an accurate
# prompt of 2048 tokens goes at the largest size (`muser bench --profile`; F16W=1: also with
# --f16-weights, and those runs beside the plain ones above). TESTS=1 runs gpu.rs
# first (TESTS_FILTER: name filters) while llama.cpp builds; NO_LLAMA=1 leaves llama.cpp out,
# NO_FAST=1 the fast runs, NO_PLAIN_PROFILE=1 the first profile; LLAMA_UBS: llama-bench's sizes (default UBS).
source scripts/h200-env.sh
source scripts/h200-llama-build.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
[ -n "${NO_LLAMA:-}" ] || LLAMA_BUILD_LOG="$OUT/llama-build.log" llama_build_start llama-bench
if [ -n "${TESTS:-}" ]; then
  MUSER_FIXTURES=tests/fixtures timeout 400 carry/bin/gpu-tests ${TESTS_FILTER:-} --nocapture --test-threads 1 > "$OUT/gpu-tests.log" 2>&1
  grep -E "^test |^test result|SKIPPED|panicked" "$OUT/gpu-tests.log" | tail -60
fi
[ -n "${NO_LLAMA:-}" ] || wait "${llama_build:-}" 2> /dev/null || echo "llama.cpp build failed (llama-build.log)"
B="carry/bin/muser bench -m $MODEL --device cuda"
log="$OUT/bench.log"; : > "$log"
for ub in ${UBS:-512 2048}; do
  timeout 200 $B -p ${PP:-512,2048} -n 0 -r ${REPS:-2} --ubatch "$ub" 2>&1 | sed "s/^| pp/| (accurate, ub $ub) pp/" | tee -a "$log"
  # F16W=1: the accurate mode with --f16-weights too (kept [hi | lo] copies while there is room).
  [ -z "${F16W:-}" ] || timeout 250 $B --f16-weights -p ${PP:-512,2048} -n 0 -r ${REPS:-2} --ubatch "$ub" 2>&1 | sed "s/^| pp/| (accurate --f16-weights, ub $ub) pp/" | tee -a "$log"
done
[ -n "${NO_FAST:-}" ] || for ub in ${UBS:-512 2048}; do
  timeout 200 $B --mode fast --fp8-weights -p 2048 -n 128 -r ${REPS:-2} --ubatch "$ub" 2>&1 | sed "s/^| \(pp\|tg\)/| (fast fp8, ub $ub) \1/" | tee -a "$log"
done
if [ -z "${NO_LLAMA:-}" ] && [ -x /tmp/llama/llama.cpp/build/bin/llama-bench ]; then
  for ub in ${LLAMA_UBS:-${UBS:-512 2048}}; do
    CUDA_VISIBLE_DEVICES=0 timeout 200 /tmp/llama/llama.cpp/build/bin/llama-bench -m "$MODEL" -ngl 99 -p ${PP:-512,2048} -n 0 -r ${REPS:-2} -b 2048 -ub "$ub" 2>&1 | sed "s/^|/| (llama.cpp, ub $ub)/" | tee -a "$log"
  done
fi
big=$(echo ${UBS:-512 2048} | tr ' ' '\n' | sort -n | tail -1)
if [ -z "${NO_PLAIN_PROFILE:-}" ]; then
  timeout 200 $B -p 2048 -n 0 -r 2 --ubatch "$big" --profile > "$OUT/profile.log" 2>&1
  sed -n '/per prompt of/,$p' "$OUT/profile.log" | head -24
fi
if [ -n "${F16W:-}" ]; then
  timeout 250 $B --f16-weights -p 512 -n 0 -r 2 --profile > "$OUT/profile-f16w.log" 2>&1
  sed -n '/per prompt of/,$p' "$OUT/profile-f16w.log" | head -24
fi
echo "== summary"
grep -E "^\| \(" "$log"
