#!/usr/bin/env bash
# Runs on the H200 machine (carry/bin in place, the synthetic 30B written if missing): gpu.rs and a
# decode A/B of measurement options against the default. STAGES (default "tests ab"; gpu.rs took
# 67 s on the carried fixtures in the fourteenth session and 111 s on the in-tree ones in the
# fifteenth, TESTS_TIMEOUT caps it at 300 s; the A/B runs stop at 550 s into the call, about 25 s
# each):
#   tests  gpu.rs on every fixture (MUSER_FIXTURES, default tests/fixtures; GPU_SKIP=name skips a
#          test; GPU_FILTER=name runs only the tests whose names contain it);
#   ab     decode tg128 (`--mode fast --fp8-weights`), alternating: the default (X=0) and each of
#          AB (space-separated; each one or more comma-separated VAR=VALUE, e.g.
#          "MUSER_NORM_TAIL_CLUSTER_SIZE=8 MUSER_MVQ_TMA_MIN_MB=100,MUSER_MVQ_STAGES=3"),
#          ROUNDS rounds (default 2), while the call has time left.
# A define (MUSER_NVRTC_DEFINES=NAME=V) compiles its kernels in its first run: give it a round
# of its own first, or expect that run to be slow.
# Logs under $OUT: warm.log, gpu-tests.log, decode.log.
cd "$(dirname "$0")/.."
source scripts/h200-env.sh
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
STAGES=${STAGES:-tests ab}
has() { [[ " $STAGES " == *" $1 "* ]]; }
FX=${MUSER_FIXTURES:-tests/fixtures}
B="carry/bin/muser bench -m $MODEL --device cuda --mode fast --fp8-weights"
# DEPTH_AB (e.g. "MUSER_X=1"), with DEPTH (default 1024): after the rounds, one more round of
# the default and each of DEPTH_AB after DEPTH tokens of context (`--depth`), time allowing.
run() {
  local t=40; [ -n "${2:-}" ] && t=60
  echo "== $1${2:+ (depth $2)}" >> "$OUT/decode.log"
  env ${1//,/ } timeout $t $B -p 0 -n 128 ${2:+--depth $2} -r 2 >> "$OUT/decode.log" 2>&1
}
timeout 150 $B -p 0 -n 16 -r 1 > "$OUT/warm.log" 2>&1; echo "warm $(el) s"
if has tests; then
  MUSER_FIXTURES=$FX timeout ${TESTS_TIMEOUT:-300} carry/bin/gpu-tests --nocapture --test-threads 1 ${GPU_SKIP:+--skip $GPU_SKIP} ${GPU_FILTER:-} \
    > "$OUT/gpu-tests.log" 2>&1
  grep -E '^test result|panicked|^test .*FAILED' "$OUT/gpu-tests.log" | tail -6; echo "tests $(el) s"
fi
if has ab; then
  for round in $(seq "${ROUNDS:-2}"); do
    for k in X=0 ${AB:-}; do
      [ "$(el)" -lt 550 ] && run "$k"
    done
  done
  if [ -n "${DEPTH_AB:-}" ]; then
    for k in X=0 $DEPTH_AB; do
      [ "$(el)" -lt 530 ] && run "$k" "${DEPTH:-1024}"
    done
  fi
fi
grep -E '^==|^\| tg' "$OUT/decode.log" 2>/dev/null; echo "done $(el) s"
