#!/usr/bin/env bash
# Runs on the H200 machine (carry/bin in place, the synthetic 30B written if missing): the
# measurement options committed without a GPU run, in the order they should be tried. STAGES
# (default "tests ab"; a 600 s call holds about two of them, "pf2" alone another):
#   tests  gpu.rs on every fixture (MUSER_FIXTURES, default tests/fixtures; GPU_SKIP=name skips a
#          test): the default kernels, and the norm test's cluster sizes 4 and 16;
#   ab     decode A/B, alternating: the default, MUSER_PDL_ATTN=1, MUSER_NORM_TAIL_CLUSTER_SIZE=4
#          and =16, two rounds;
#   pf2    the define MVQ_PF2=1: a warm run (its kernels compile), gpu.rs's one-token, fixture and
#          fast-mode tests under it (their printed figures should be a default run's), then
#          decode A/B against the default.
# Logs under $OUT: warm.log, gpu-tests.log, gpu-tests-pf2.log, decode.log.
cd "$(dirname "$0")/.."
source scripts/h200-env.sh
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
STAGES=${STAGES:-tests ab}
has() { [[ " $STAGES " == *" $1 "* ]]; }
FX=${MUSER_FIXTURES:-tests/fixtures}
B="carry/bin/muser bench -m $MODEL --device cuda --mode fast --fp8-weights"
run() { echo "== $1" >> "$OUT/decode.log"; env $1 timeout 40 $B -p 0 -n 128 -r 2 >> "$OUT/decode.log" 2>&1; }
timeout 150 $B -p 0 -n 16 -r 1 > "$OUT/warm.log" 2>&1; echo "warm $(el) s"
if has tests; then
  MUSER_FIXTURES=$FX timeout 200 carry/bin/gpu-tests --nocapture --test-threads 1 ${GPU_SKIP:+--skip $GPU_SKIP} \
    > "$OUT/gpu-tests.log" 2>&1
  grep -E '^test result|panicked|^test .*FAILED' "$OUT/gpu-tests.log" | tail -6; echo "tests $(el) s"
fi
if has ab; then
  for round in 1 2; do
    for k in X=0 MUSER_PDL_ATTN=1 MUSER_NORM_TAIL_CLUSTER_SIZE=4 MUSER_NORM_TAIL_CLUSTER_SIZE=16; do
      [ "$(el)" -lt 550 ] && run "$k"
    done
  done
fi
if has pf2; then
  MUSER_NVRTC_DEFINES=MVQ_PF2=1 timeout 150 $B -p 0 -n 16 -r 1 > "$OUT/warm2.log" 2>&1; echo "warm2 $(el) s"
  MUSER_NVRTC_DEFINES=MVQ_PF2=1 MUSER_FIXTURES=$FX timeout 200 carry/bin/gpu-tests --nocapture --test-threads 1 \
    one_token cuda_matches_cpu_accurate fast_mode > "$OUT/gpu-tests-pf2.log" 2>&1
  grep -E '^test result|panicked' "$OUT/gpu-tests-pf2.log" | tail -3; echo "pf2 tests $(el) s"
  for k in MUSER_NVRTC_DEFINES=MVQ_PF2=1 X=0 MUSER_NVRTC_DEFINES=MVQ_PF2=1 X=0; do
    [ "$(el)" -lt 550 ] && run "$k"
  done
fi
grep -E '^==|^\| tg' "$OUT/decode.log" 2>/dev/null; echo "done $(el) s"
