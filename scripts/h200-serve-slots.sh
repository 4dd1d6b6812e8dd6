#!/usr/bin/env bash
# Runs on the H200 machine (repo root, carry=["carry"] holding carry/bin.tar.xz): saved slots in
# `muser serve` on the synthetic 30B. For prompts of several lengths: the prompt's first run
# (max_tokens 1), the slot saved to --slot-save-path, erased, restored, and the prompt with 16
# more tokens asked again (served from the restored cache): save and restore times against the
# prompt's own, and the cached tokens the answer reports.
#   SERVE_FLAGS (default "--mode fast --fp8-weights"), LENS (default "4096 16384 32000").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log="$OUT/serve-slots.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$log"
SYNTH_LOG="$log"
source scripts/h200-env.sh
rm -rf /tmp/slots
carry/bin/muser serve -m "$MODEL" --device cuda ${SERVE_FLAGS:---mode fast --fp8-weights} --parallel 2 --ctx-size 32768 \
  --port 8081 --slot-save-path /tmp/slots > "$OUT/serve-slots-server.log" 2>&1 &
spid=$!
for _ in $(seq 300); do curl -sf http://127.0.0.1:8081/health > /dev/null && break; sleep 1; done
python3 - ${LENS:-4096 16384 32000} <<'PY' 2>&1 | tee -a "$log"
import json, random, sys, time, urllib.request
U = "http://127.0.0.1:8081"
def post(path, body):
    r = urllib.request.Request(U + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(r, timeout=600) as f:
        return json.load(f), (time.perf_counter() - t) * 1e3
def get(path):
    with urllib.request.urlopen(U + path, timeout=60) as f:
        return json.load(f)
rng = random.Random(7)
# A warm-up request (kernels, graphs).
post("/v1/completions", {"prompt": [rng.randrange(1000, 100000) for _ in range(600)], "max_tokens": 4})
for n in map(int, sys.argv[1:]):
    prompt = [rng.randrange(1000, 100000) for _ in range(n)]
    _, first_ms = post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
    slot = next(s for s in get("/slots") if s["n_cached"] == n)["id"]
    saved, _ = post(f"/slots/{slot}?action=save", {"filename": f"p{n}.bin"})
    post(f"/slots/{slot}?action=erase", {})
    restored, _ = post(f"/slots/{slot}?action=restore", {"filename": f"p{n}.bin"})
    more = prompt + [rng.randrange(1000, 100000) for _ in range(16)]
    r, again_ms = post("/v1/completions", {"prompt": more, "max_tokens": 1, "temperature": 0})
    cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
    print(f"{n:6} tokens: prompt run {first_ms:8.1f} ms; save {saved['timings']['save_ms']:7.1f} ms "
          f"({saved['n_written']/2**20:.1f} MiB); restore {restored['timings']['restore_ms']:7.1f} ms "
          f"({restored['n_restored']} positions); prompt + 16 after the restore {again_ms:7.1f} ms, cached {cached}")
PY
kill $spid; wait $spid 2>/dev/null
tail -4 "$OUT/serve-slots-server.log"
