#!/usr/bin/env bash
# Runs on the H200 machine (repo root, carry holding carry/bin or carry/bin.tar.xz): a burst of
# CLIENTS (64) requests at once on /v1/completions, each beginning with the same system prompt
# of SYSTEM_WORDS (300) words (about 1,850 tokens of the synthetic files' tokenizer) and asking MAX_TOKENS (64) tokens (ignore_eos), on a fresh
# `muser serve`, then a second burst on the same server: with `--no-prefix-reuse` (every prompt
# run whole: what a fresh server did for a first burst before prompts were shared in flight)
# and with the default (the burst's prompts share the system prompt's cache in flight; the
# second burst also finds it in the caches the first left). SERVE_FLAGS (default "--mode fast
# --fp8-weights").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log="$OUT/serve-burst.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$log"
SYNTH_LOG="$log"
source scripts/h200-env.sh
for mode in whole shared; do
  flag=""; [ "$mode" = whole ] && flag="--no-prefix-reuse"
  carry/bin/muser serve -m "$MODEL" --device cuda ${SERVE_FLAGS:---mode fast --fp8-weights} --parallel ${CLIENTS:-64} --ctx-size 4096 $flag \
    --port 8081 --alias muser --chat-template-file crates/text/tests/data/muse-glimmer.jinja > "$OUT/serve-$mode.log" 2>&1 &
  spid=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:8081/health > /dev/null && break; sleep 1; done
  for wave in 1 2; do
    timeout 300 python3 crates/server/tests/load/load.py --clients ${CLIENTS:-64} --duration 0.01 --ignore-eos \
      --min-tokens ${MAX_TOKENS:-64} --max-tokens ${MAX_TOKENS:-64} --endpoint completions --system-words ${SYSTEM_WORDS:-300} \
      --url http://127.0.0.1:8081 --model muser --server-pid $spid --sample-every 1 --out "/tmp/burst-$mode-$wave.json" > /dev/null 2>&1
    python3 - "/tmp/burst-$mode-$wave.json" "$mode, burst $wave" <<'PY' | tee -a "$log"
import json, sys
r = json.load(open(sys.argv[1])); t = r["ttft_ms"]; l = r["latency_ms"]
print(f"{sys.argv[2]:17}: ok {r['requests_ok']} failed {r['requests_failed']} {r['failures']} in {r['duration_s']} s, "
      f"prompt tokens {r['prompt_tokens']} (cached {r['cached_prompt_tokens']}), completion tokens {r['completion_tokens']}, "
      f"ttft p50 {t['p50']} p99 {t['p99']} ms, latency p50 {l['p50']} p99 {l['p99']} ms")
PY
  done
  curl -s http://127.0.0.1:8081/metrics | grep -E '^muser_prompt_tokens_(total|shared_total|reused_total)' | sed "s/^/$mode /" | tee -a "$log"
  kill $spid; wait $spid 2>/dev/null
  tail -3 "$OUT/serve-$mode.log" > "$OUT/serve-$mode-tail.log"; rm -f "$OUT/serve-$mode.log"
done
