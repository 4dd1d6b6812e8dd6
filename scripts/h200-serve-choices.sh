#!/usr/bin/env bash
# Runs on the H200 machine (repo root, carry holding carry/bin.tar.xz and optionally
# carry/old.tar.xz, an earlier binary, muser-old, for an A/B in the same call): requests of n
# choices whose prompts are shared (tools/serve_probe.py choices: REQUESTS requests of N choices
# of a PROMPT-token prompt, CONC at a time, MAX_TOKENS each), against the earlier binary and
# this one; then this one's prompt scoring (echo, max_tokens 0, logprobs 1). GPU_FILTER (default
# "copied_device device_draws"): gpu.rs tests first ("" skips them).
#   SERVE_FLAGS (default "--mode fast --fp8-weights").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log="$OUT/serve-choices.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$log"
SYNTH_LOG="$log"
source scripts/h200-env.sh
if [ -n "${GPU_FILTER-copied_device device_draws}" ]; then
  timeout 300 carry/bin/gpu-tests --nocapture --test-threads 1 ${GPU_FILTER-copied_device device_draws} > "$OUT/gpu-tests.log" 2>&1
  grep -E '^test result|panicked|^test .*FAILED|^copied|^device draws' "$OUT/gpu-tests.log" | tail -6 | tee -a "$log"
fi
bins="new"
[ -f carry/old.tar.xz ] && tar -C /tmp -xJf carry/old.tar.xz && bins="old new"
P="python3 tools/serve_probe.py --url http://127.0.0.1:8081"
C="--requests ${REQUESTS:-32} --conc ${CONC:-8} --n ${N:-8} --prompt ${PROMPT:-1024} --max-tokens ${MAX_TOKENS:-32}"
for b in $bins; do
  exe=carry/bin/muser; [ "$b" = old ] && exe=/tmp/muser-old
  $exe serve -m "$MODEL" --device cuda ${SERVE_FLAGS:---mode fast --fp8-weights} --parallel 64 --ctx-size 2048 \
    --port 8081 --alias muser > "$OUT/serve-$b.log" 2>&1 &
  spid=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:8081/health > /dev/null && break; sleep 1; done
  timeout 200 $P choices --requests 8 --conc 8 --n 2 --prompt 256 --max-tokens 8 --label "$b warm " > /dev/null 2>&1
  timeout 300 $P choices $C --label "$b " 2>&1 | tail -3 | tee -a "$log"
  if [ "$b" = new ]; then
    timeout 200 $P echo --requests ${REQUESTS:-32} --conc ${CONC:-8} --prompt ${PROMPT:-1024} --label "$b " 2>&1 | tail -3 | tee -a "$log"
    curl -s http://127.0.0.1:8081/metrics | grep -E '^muser_prompt_tokens_(total|shared_total)' | sed "s/^/$b /" | tee -a "$log"
  fi
  kill $spid; wait $spid 2>/dev/null
  tail -4 "$OUT/serve-$b.log" > "$OUT/serve-$b-tail.log"; rm -f "$OUT/serve-$b.log"
done
