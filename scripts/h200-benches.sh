#!/usr/bin/env bash
# Runs on the H200 machine (the synthetic 30B written if missing, or MODEL): a list of `muser bench` runs, each "VAR=VALUE ... | bench arguments", separated by
# ';' in BENCHES, e.g.
#   BENCHES="| -p 512,2048 -n 0 -r 2; MUSER_GEMM16=0 | -p 512 -n 0 -r 2; | --mode fast -p 512 -n 0"
# Every run's table goes to $OUT/benches.log under a line naming its variant.
source "$(dirname "$0")/h200-env.sh"
log="$OUT/benches.log"
IFS=';' read -ra runs <<< "${BENCHES:-}"
for r in "${runs[@]}"; do
  envs=${r%%|*}
  args=${r#*|}
  echo "==== [${envs// /}] ${args}" | tee -a "$log"
  env $envs timeout ${BENCH_TIMEOUT:-240} carry/bin/muser bench -m "$MODEL" --device cuda $args 2>&1 | grep -E '^\||^model|rror' | tee -a "$log"
done
