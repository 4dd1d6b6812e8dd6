#!/usr/bin/env bash
# Runs on the H200 machine (repo root, carry holding carry/bin or carry/bin.tar.xz): the gpu.rs
# tests (GPU_FILTER, default all), then `muser serve` with logprobs asked by every request, 64
# streaming clients on /v1/completions, 128 tokens a request (ignore_eos), temperature 0.8,
# LOGPROBS (5) alternatives, SERVE_WARM (15) seconds not counted, then SERVE_SECONDS (25): the
# rows scored on the host (`MUSER_LOGPROBS_ON_HOST=1`: rows read to the host, drawn and scored
# there, as before) against the device's (`row_logprobs`), one after the other on one binary;
# then the same server without logprobs.   SERVE_FLAGS (default "--mode fast --fp8-weights").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log="$OUT/serve-logprobs.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$log"
SYNTH_LOG="$log"
source scripts/h200-env.sh
if [ "${GPU_FILTER-all}" != none ]; then
  filter=${GPU_FILTER-}; [ "$filter" = all ] && filter=""
  timeout 400 carry/bin/gpu-tests --nocapture --test-threads 1 $filter > "$OUT/gpu-tests.log" 2>&1
  grep -E '^test result|panicked|^test .*FAILED|^device (draws|top-k|log-prob)' "$OUT/gpu-tests.log" | cut -c1-400 | tail -10 | tee -a "$log"
fi
for mode in host device; do
  env_knob=""; [ "$mode" = host ] && env_knob="MUSER_LOGPROBS_ON_HOST=1"
  env $env_knob carry/bin/muser serve -m "$MODEL" --device cuda ${SERVE_FLAGS:---mode fast --fp8-weights} --parallel 64 --ctx-size 1024 \
    --port 8081 --alias muser --chat-template-file crates/text/tests/data/muse-glimmer.jinja > "$OUT/serve-$mode.log" 2>&1 &
  spid=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:8081/health > /dev/null && break; sleep 1; done
  LOAD="python3 crates/server/tests/load/load.py --clients 64 --ignore-eos --min-tokens 128 --max-tokens 128 --endpoint completions --url http://127.0.0.1:8081 --model muser --server-pid $spid"
  LP="--logprobs ${LOGPROBS:-5}"
  timeout 300 $LOAD --duration ${SERVE_WARM:-15} $LP > /dev/null 2>&1
  timeout 300 $LOAD --duration ${SERVE_SECONDS:-25} $LP --out "/tmp/load-$mode.json" > /dev/null 2>&1
  serve_summary "/tmp/load-$mode.json" "logprobs on the $mode"
  curl -s http://127.0.0.1:8081/metrics | grep -E '^muser_draws_total' | sed "s/^/$mode /" | tee -a "$log"
  if [ "$mode" = device ]; then
    timeout 300 $LOAD --duration ${SERVE_SECONDS:-25} --out "/tmp/load-plain.json" > /dev/null 2>&1
    serve_summary "/tmp/load-plain.json" "no logprobs (same server)"
  fi
  kill $spid; wait $spid 2>/dev/null
  tail -5 "$OUT/serve-$mode.log" > "$OUT/serve-$mode-tail.log"; rm -f "$OUT/serve-$mode.log"
done
