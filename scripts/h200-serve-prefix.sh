#!/usr/bin/env bash
# Runs on the H200 machine (repo root, carry=["carry"] holding carry/bin/muser or
# carry/bin.tar.xz): prefix reuse in `muser serve`. 64 streaming chat clients, each keeping a
# conversation of TURNS requests (its answers and a new user message appended), against one
# server with prefix reuse and then one started with --no-prefix-reuse, same file and load.
#   SERVE_FLAGS (default "--mode fast --fp8-weights"), SERVE_SECONDS (30), SERVE_WARM (20), TURNS (4),
#   CTX (4096: a slot's context; the random answers' text re-tokenizes longer than the 128 tokens
#   drawn, and at 2048 a fourth turn outgrew it: a 400, context_length_exceeded).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log="$OUT/serve-prefix.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$log"
SYNTH_LOG="$log"
source scripts/h200-env.sh
for mode in reuse none; do
  flag=""; [ "$mode" = none ] && flag="--no-prefix-reuse"
  carry/bin/muser serve -m "$MODEL" --device cuda ${SERVE_FLAGS:---mode fast --fp8-weights} $flag --parallel 64 --ctx-size ${CTX:-4096} \
    --port 8081 --alias muser --chat-template-file crates/text/tests/data/muse-glimmer.jinja > "$OUT/serve-$mode.log" 2>&1 &
  spid=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:8081/health > /dev/null && break; sleep 1; done
  LOAD="python3 crates/server/tests/load/load.py --clients 64 --ignore-eos --min-tokens 128 --max-tokens 128 --endpoint chat --turns ${TURNS:-4} --url http://127.0.0.1:8081 --model muser --server-pid $spid"
  timeout 300 $LOAD --duration ${SERVE_WARM:-20} > /dev/null 2>&1
  timeout 300 $LOAD --duration ${SERVE_SECONDS:-30} --out "/tmp/load-$mode.json" > /dev/null 2>&1
  python3 - "/tmp/load-$mode.json" "$mode" <<'PY' | tee -a "$log"
import json, sys
r = json.load(open(sys.argv[1])); t = r["ttft_ms"]
print(f"{sys.argv[2]:5}: ok {r['requests_ok']} failed {r['requests_failed']} {r['failures']} completion tokens/s {r['tokens_per_s']} "
      f"prompt tokens {r['prompt_tokens']} (cached {r['cached_prompt_tokens']}) ttft p50 {t['p50']} ms p99 {t['p99']} ms, "
      f"engine step {r.get('step_ms_mean')} ms (forward {r.get('forward_ms_mean')}, sampling {r.get('sample_ms_mean')})")
PY
  kill $spid; wait $spid 2>/dev/null
  tail -5 "$OUT/serve-$mode.log" > "$OUT/serve-$mode-tail.log"; rm -f "$OUT/serve-$mode.log"
done
