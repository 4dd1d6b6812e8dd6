#!/usr/bin/env bash
# Runs on the GPU machine (after scripts/h200-prepare.sh, carry=["carry"]): forwards of a few
# tokens, A/B. For each setting in AB (space-separated; a setting is VAR=VALUE[,VAR=VALUE...], the
# default's own value named so that every run is labelled), alternating over ROUNDS rounds: batched decode of PARS
# sequences (`muser bench --parallel`, tokens drawn on the device), forwards of CHUNKS tokens
# (`muser bench -p`, a prompt chunk as a step with a guess), and `muser generate` greedy with
# guesses (DRAFT N:M) on the speculative runs' prompt. FLAGS: muser's flags (default
# "--device cuda --mode fast --fp8-weights").
source "$(dirname "$0")/h200-env.sh"
log="$OUT/fewtok.log"
flags=${FLAGS:-"--device cuda --mode fast --fp8-weights"}
ids=$(spec_prompt_ids)
d=${DRAFT:-2:8}
for round in $(seq ${ROUNDS:-2}); do
  for e in ${AB:-MUSER_MMQ_FUSED_SUM=0 MUSER_MMQ_FUSED_SUM=1,MUSER_XQ_PAD_TB=1,MUSER_XQ_REUSE=1}; do
    echo "== $e, round $round" | tee -a "$log"
    env ${e//,/ } timeout 200 carry/bin/muser bench -m "$MODEL" $flags -p 0 -n 0 --parallel "${PARS:-2,4,8,9,16}" \
      --batch-prompt 32 --batch-gen 64 --batch-draw 2>&1 | grep -E '^\|' | tee -a "$log"
    env ${e//,/ } timeout 200 carry/bin/muser bench -m "$MODEL" $flags -p "${CHUNKS:-2,5,9,17}" -n 0 -r 3 2>&1 \
      | grep -E '^\| pp' | tee -a "$log"
    env ${e//,/ } timeout 200 carry/bin/muser generate -m "$MODEL" $flags --prompt-ids "$ids" -n "${GEN_N:-512}" --temp 0 \
      --draft-ngram "${d%%:*}" --draft-max "${d##*:}" > /dev/null 2> /tmp/gen.err
    echo "generate --draft-ngram ${d%%:*} --draft-max ${d##*:}: $(grep -E '^\[' /tmp/gen.err | tail -1)" | tee -a "$log"
  done
done
