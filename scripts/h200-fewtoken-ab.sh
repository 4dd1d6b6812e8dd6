#!/usr/bin/env bash
# Runs on the GPU machine (carry=["carry"]): the few-token forms' bits test, then, for each setting
# in AB (space-separated; VAR=V[,VAR=V...]), one batched-decode bench of PARS sequences and one of
# prompt chunks of CHUNKS tokens (a step with a guess), each setting's model load its own. A short
# form of h200-fewtok.sh for a call with little device time left. With BASE set, one-sequence decode
# against that binary first.
source "$(dirname "$0")/h200-env.sh"
log="$OUT/fewtoken-ab.log"
MUSER_FIXTURES=tests/fixtures timeout ${TEST_S:-150} carry/bin/gpu-tests ${TESTS:-few_token lean_few_token} --nocapture --test-threads 1 > "$OUT/tests.log" 2>&1
grep -E "^test |test result|panicked|fast (true|false)|differs" "$OUT/tests.log" | tail -20 | tee -a "$log"
flags=${FLAGS:-"--device cuda --mode fast --fp8-weights"}
# One-sequence decode, this binary against BASE (a binary carried beside it, e.g. carry/bin/base-muser),
# alternated ROUNDS times so that drift of the clocks falls on both.
if [ -n "${BASE:-}" ]; then
  for r in $(seq ${ROUNDS:-2}); do
    for b in "$BASE" carry/bin/muser; do
      timeout 120 $b bench -m "$MODEL" $flags -p 0 -n 128 -r 3 2>&1 | grep -E '^\| tg' | sed "s#^| #| ($b) #" | tee -a "$log"
    done
  done
fi
for e in ${AB:-MUSER_MVQ_TOKENS=1 MUSER_MVQ_TOKENS=3,MUSER_MMQ_FUSED_SUM=1,MUSER_XQ_PAD_TB=1,MUSER_XQ_REUSE=1}; do
  echo "== $e" | tee -a "$log"
  env ${e//,/ } timeout 120 carry/bin/muser bench -m "$MODEL" $flags -p 0 -n 0 --parallel "${PARS:-2,3,4,9}" \
    --batch-prompt 32 --batch-gen 64 --batch-draw 2>&1 | grep -E '^\|' | tee -a "$log"
  env ${e//,/ } timeout 100 carry/bin/muser bench -m "$MODEL" $flags -p "${CHUNKS:-2,3,9}" -n 0 -r 3 2>&1 \
    | grep -E '^\| pp' | tee -a "$log"
done
