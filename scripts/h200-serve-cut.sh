#!/usr/bin/env bash
# Runs on the H200 machine (repo root, carry holding carry/bin or carry/bin.tar.xz): the gpu.rs
# tests of device draws (GPU_FILTER, default "draw cut"), then `muser serve` under top-p (and
# top-k) sampling, 64 streaming clients on /v1/completions, 128 tokens a request (ignore_eos),
# temperature 0.8, SERVE_WARM (15) seconds not counted, then SERVE_SECONDS (25): the rows cut on
# the host (`MUSER_CUTS_ON_HOST=1`, the host chain, as before the device cut them) against the
# device's cut (`draw_cut`), one after the other on one binary; then the same without top-p.
#   SERVE_FLAGS (default "--mode fast --fp8-weights"), TOP_P (0.95), TOP_K (0: not sent).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log="$OUT/serve-cut.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$log"
SYNTH_LOG="$log"
source scripts/h200-env.sh
if [ -n "${GPU_FILTER-draw cut}" ]; then
  timeout 300 carry/bin/gpu-tests --nocapture --test-threads 1 ${GPU_FILTER-draw cut} > "$OUT/gpu-tests.log" 2>&1
  grep -E '^test result|panicked|^test .*FAILED|^device (draws|top-k)' "$OUT/gpu-tests.log" | cut -c1-400 | tail -8 | tee -a "$log"
fi
CUT="--top-p ${TOP_P:-0.95} --top-k ${TOP_K:-0}"
for mode in host device; do
  env_knob=""; [ "$mode" = host ] && env_knob="MUSER_CUTS_ON_HOST=1"
  env $env_knob carry/bin/muser serve -m "$MODEL" --device cuda ${SERVE_FLAGS:---mode fast --fp8-weights} --parallel 64 --ctx-size 1024 \
    --port 8081 --alias muser --chat-template-file crates/text/tests/data/muse-glimmer.jinja > "$OUT/serve-$mode.log" 2>&1 &
  spid=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:8081/health > /dev/null && break; sleep 1; done
  LOAD="python3 crates/server/tests/load/load.py --clients 64 --ignore-eos --min-tokens 128 --max-tokens 128 --endpoint completions --url http://127.0.0.1:8081 --model muser --server-pid $spid"
  timeout 300 $LOAD --duration ${SERVE_WARM:-15} $CUT > /dev/null 2>&1
  timeout 300 $LOAD --duration ${SERVE_SECONDS:-25} $CUT --out "/tmp/load-$mode.json" > /dev/null 2>&1
  serve_summary "/tmp/load-$mode.json" "cut on the $mode"
  curl -s http://127.0.0.1:8081/metrics | grep -E '^muser_draws_total' | sed "s/^/$mode /" | tee -a "$log"
  if [ "$mode" = device ]; then
    timeout 300 $LOAD --duration ${SERVE_SECONDS:-25} --out "/tmp/load-plain.json" > /dev/null 2>&1
    serve_summary "/tmp/load-plain.json" "no cut (same server)"
  fi
  kill $spid; wait $spid 2>/dev/null
  tail -5 "$OUT/serve-$mode.log" > "$OUT/serve-$mode-tail.log"; rm -f "$OUT/serve-$mode.log"
done
