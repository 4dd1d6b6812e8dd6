#!/usr/bin/env bash
# Runs on the H200 machine (repo root, carry=["carry"] holding carry/bin/muser or
# carry/bin.tar.xz): `muser serve` under 64 streaming chat clients, the same load with and
# without a tool offered under `tool_choice: "auto"` (the lazy grammar: an answer is constrained
# only once it begins a call), alternating, on one server; the draws' places from /metrics.
#   SERVE_FLAGS (default "--mode fast --fp8-weights"), SERVE_SECONDS (30), SERVE_WARM (20).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/serve-tools.log"
SYNTH_LOG="$OUT/serve-tools.log"
source scripts/h200-env.sh
carry/bin/muser serve -m "$MODEL" --device cuda ${SERVE_FLAGS:---mode fast --fp8-weights} --parallel 64 --ctx-size 2048 \
  --port 8081 --alias muser --chat-template-file crates/text/tests/data/muse-glimmer.jinja > "$OUT/serve-muser.log" 2>&1 &
spid=$!
for _ in $(seq 300); do curl -sf http://127.0.0.1:8081/health > /dev/null && break; sleep 1; done
LOAD="python3 crates/server/tests/load/load.py --clients 64 --ignore-eos --min-tokens 128 --max-tokens 128 --endpoint chat --url http://127.0.0.1:8081 --model muser --server-pid $spid"
timeout 300 $LOAD --duration ${SERVE_WARM:-20} --tools > /dev/null 2>&1
for run in plain tools plain tools; do
  flag=""; [ "$run" = tools ] && flag="--tools"
  timeout 300 $LOAD --duration ${SERVE_SECONDS:-30} $flag --out "/tmp/load-$run.json" > /dev/null 2>&1
  python3 - "/tmp/load-$run.json" "$run" <<'PY' | tee -a "$OUT/serve-tools.log"
import json, sys
r = json.load(open(sys.argv[1])); t = r["ttft_ms"]
print(f"{sys.argv[2]:5}: ok {r['requests_ok']} failed {r['requests_failed']} {r['failures']} completion tokens/s {r['tokens_per_s']} "
      f"prompt tokens {r['prompt_tokens']} (cached {r['cached_prompt_tokens']}) ttft p50 {t['p50']} ms p99 {t['p99']} ms, "
      f"engine step {r.get('step_ms_mean')} ms (forward {r.get('forward_ms_mean')}, sampling {r.get('sample_ms_mean')}), draws {r.get('draws')}")
PY
done
kill $spid; wait $spid 2>/dev/null
tail -5 "$OUT/serve-muser.log" > "$OUT/serve-muser-tail.log"; rm -f "$OUT/serve-muser.log"
