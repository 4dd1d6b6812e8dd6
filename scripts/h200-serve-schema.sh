#!/usr/bin/env bash
# Runs on the H200 machine (repo root, carry holding carry/bin/muser or carry/bin.tar.xz, and
# optionally carry/old.tar.xz with an earlier binary, muser-old, for an A/B in the same call):
# `muser serve` under a JSON schema. 64 streaming clients on /v1/completions, 128 tokens a request
# (ignore_eos), every request carrying llama.cpp's `json_schema` field (SCHEMA), SERVE_WARM (15)
# seconds not counted, then SERVE_SECONDS (25); the new binary also without the schema, on the
# same server. GPU_FILTER (default "draw"): the gpu.rs tests run first ("" skips them).
#   SERVE_FLAGS (default "--mode fast --fp8-weights").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log="$OUT/serve-schema.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$log"
SYNTH_LOG="$log"
source scripts/h200-env.sh
SCHEMA=${SCHEMA:-'{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]}'}
if [ -n "${GPU_FILTER-draw}" ]; then
  timeout 300 carry/bin/gpu-tests --nocapture --test-threads 1 ${GPU_FILTER-draw} > "$OUT/gpu-tests.log" 2>&1
  grep -E '^test result|panicked|^test .*FAILED|^device draws' "$OUT/gpu-tests.log" | tail -6 | tee -a "$log"
fi
bins="new"
[ -f carry/old.tar.xz ] && tar -C /tmp -xJf carry/old.tar.xz && bins="old new"
for b in $bins; do
  exe=carry/bin/muser; [ "$b" = old ] && exe=/tmp/muser-old
  $exe serve -m "$MODEL" --device cuda ${SERVE_FLAGS:---mode fast --fp8-weights} --parallel 64 --ctx-size 1024 \
    --port 8081 --alias muser --chat-template-file crates/text/tests/data/muse-glimmer.jinja > "$OUT/serve-$b.log" 2>&1 &
  spid=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:8081/health > /dev/null && break; sleep 1; done
  LOAD="python3 crates/server/tests/load/load.py --clients 64 --ignore-eos --min-tokens 128 --max-tokens 128 --endpoint completions --url http://127.0.0.1:8081 --model muser --server-pid $spid"
  timeout 300 $LOAD --duration ${SERVE_WARM:-15} --json-schema "$SCHEMA" > /dev/null 2>&1
  timeout 300 $LOAD --duration ${SERVE_SECONDS:-25} --json-schema "$SCHEMA" --out "/tmp/load-$b.json" > /dev/null 2>&1
  serve_summary "/tmp/load-$b.json" "$b schema"
  curl -s http://127.0.0.1:8081/metrics | grep -E '^muser_(draws|grammar_redraws)_total' | sed "s/^/$b /" | tee -a "$log"
  if [ "$b" = new ]; then
    timeout 300 $LOAD --duration ${SERVE_SECONDS:-25} --out "/tmp/load-$b-plain.json" > /dev/null 2>&1
    serve_summary "/tmp/load-$b-plain.json" "$b plain"
  fi
  kill $spid; wait $spid 2>/dev/null
  tail -5 "$OUT/serve-$b.log" > "$OUT/serve-$b-tail.log"; rm -f "$OUT/serve-$b.log"
done
