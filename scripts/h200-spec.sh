#!/usr/bin/env bash
# Speculative decoding from the sequence's own tokens on the GPU machine (after
# scripts/h200-prepare.sh, carry=["carry"]): `muser generate` greedy, plain and with
# --draft-ngram N --draft-max M (DRAFTS, space-separated N:M), the same prompt and flags
# (GEN_FLAGS; while llama-server builds, when carry/llama.tar.xz came), the tokens compared with plain decoding's; then `muser bench` decode for the
# graph's one-token rate in the same call. The synthetic model's random weights make no sense of
# a prompt: its greedy output falls into loops, which is where guesses are kept; the figures say
# how much a kept guess saves, not how often a real model's would be kept.
source "$(dirname "$0")/h200-env.sh"
log="$OUT/spec.log"
# llama.cpp b11434's llama-server, built on this machine's CPU (niced) from carry/llama.tar.xz while
# `muser generate` runs below (the tracked tree leaves no room in the carry for prebuilt CUDA
# binaries); the server comparison waits for it.
# LLAMA_SERVER: a llama-server built elsewhere (the CPU comparison: LLAMA_FLAGS="-t 2", GEN_FLAGS
# "--device cpu"); otherwise the one built here.
source "$(dirname "$0")/h200-llama-build.sh"
[ "$LLAMA_SERVER" = /tmp/llama/llama.cpp/build/bin/llama-server ] && llama_build_start llama-server
FLAGS=${GEN_FLAGS:-"--device cuda --mode fast --fp8-weights"}
N=${GEN_N:-512}
ids=$(spec_prompt_ids)
run() {
  timeout 300 carry/bin/muser generate -m "$MODEL" $FLAGS --prompt-ids "$ids" -n "$N" --temp 0 --print-ids "$@" \
    > /tmp/gen.out 2> /tmp/gen.err
  echo "rc=$? $*: $(grep -E '^\[' /tmp/gen.err | tail -1)" | tee -a "$log"
}
run
cp /tmp/gen.out /tmp/plain.out
for d in ${DRAFTS:-"2:4 2:8 3:16"}; do
  run --draft-ngram "${d%%:*}" --draft-max "${d##*:}"
  if cmp -s /tmp/gen.out /tmp/plain.out; then
    echo "  the same $N tokens as plain decoding" | tee -a "$log"
  else
    echo "  differs from plain decoding at token $(python3 -c 'import sys; a=open("/tmp/gen.out").read().split(); b=open("/tmp/plain.out").read().split(); print(next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), min(len(a),len(b))))')" | tee -a "$log"
  fi
done
# The batch-invariant mode (accurate), where a guess's rows have one token's bits: the same tokens
# as plain decoding (INV_FLAGS; empty to skip).
INV=${INV_FLAGS-"--device cuda --batch-invariant"}
if [ -n "$INV" ]; then
  keep=$FLAGS; FLAGS=$INV
  run; cp /tmp/gen.out /tmp/plain-inv.out
  run --draft-ngram 2 --draft-max 8
  cmp -s /tmp/gen.out /tmp/plain-inv.out && echo "  the same $N tokens as plain decoding" | tee -a "$log" || echo "  differs from plain decoding" | tee -a "$log"
  FLAGS=$keep
fi
# Further runs with a kernel switch (EXTRA: space-separated VAR=VALUE@N:M): what a guess's forward
# costs on another route (e.g. MUSER_MMQ=0@2:7, 8-token forwards on the matvec kernels).
for e in ${EXTRA:-}; do
  ( export "${e%%@*}"; d=${e##*@}; echo -n "${e%%@*} " | tee -a "$log"; run --draft-ngram "${d%%:*}" --draft-max "${d##*:}" )
  cmp -s /tmp/gen.out /tmp/plain.out && echo "  the same $N tokens as plain decoding" | tee -a "$log" || echo "  differs from plain decoding" | tee -a "$log"
done
# Where the plain run's tokens repeat: the share of steps a perfect guess could skip.
python3 - <<'PY' | tee -a "$log"
t = open("/tmp/plain.out").read().split()
print(f"plain output: {len(t)} tokens, {len(set(t))} distinct; first 40: {' '.join(t[:40])}")
PY
# The build done (if any), so that what follows shares the machine with nothing.
[ -n "${llama_build:-}" ] && { wait $llama_build; tail -3 /tmp/llama-build.log > "$OUT/llama-build-tail.log"; }
echo "llama-server build: $(ls "$LLAMA_SERVER" 2>/dev/null || echo none) at $(date +%T)" | tee -a "$log"
timeout 200 carry/bin/muser bench -m "$MODEL" $FLAGS -p 0 -n 128 -r 2 2>&1 | grep -E '^\| tg' | tee -a "$log"
# What a guess's forward costs: a chunk of 2 to 17 tokens, as a step with a guess of 1 to 16.
timeout 200 carry/bin/muser bench -m "$MODEL" $FLAGS -p ${CHUNKS:-2,3,5,9,17} -n 0 -r 3 2>&1 | grep -E '^\| pp' | tee -a "$log"
# The server, one client, the same prompt greedy (SERVE_N tokens, ignore_eos), plain and guessing:
# the time of the answer and whether the texts agree; then llama-server b11434 (prebuilt,
# carry/llama-bin.tar.xz from scripts/llama-prebuild.sh) on the same file and body, plain and with
# its ngram-simple drafts (--spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 8, Muser's
# --draft-ngram 2 --draft-max 8), after its build (above) is done.
SN=${SERVE_N:-256}
body=$(python3 -c "import json,sys; print(json.dumps({'prompt':[int(x) for x in sys.argv[1].split(',')],'max_tokens':$SN,'temperature':0,'ignore_eos':True}))" "$ids")
serve_once() {
  carry/bin/muser serve -m "$MODEL" $FLAGS --port 8089 --parallel 4 "$@" > /tmp/serve.log 2>&1 &
  pid=$!
  for _ in $(seq 240); do curl -sf localhost:8089/health > /dev/null && break; sleep 1; done
  curl -s localhost:8089/v1/completions -H 'content-type: application/json' -d "$body" > /dev/null  # warm
  t0=$(date +%s.%N)
  curl -s localhost:8089/v1/completions -H 'content-type: application/json' -d "$body" > /tmp/answer.json
  t1=$(date +%s.%N)
  curl -s localhost:8089/metrics > /tmp/serve-metrics.txt
  kept=$(grep '^muser_draft_tokens_total' /tmp/serve-metrics.txt | tr '\n' ' ')
  # The engine's steps over both requests (the prompts' included): mean step, forward (with the
  # device draws) and sampling; against `generate`'s forwards, what the server adds to a step.
  kept="$kept$(python3 - <<'PY'
import re
m = {}
for line in open("/tmp/serve-metrics.txt"):
    g = re.match(r"^(muser_(?:step|forward|sample)_seconds)_(sum|count) ([0-9.e+-]+)", line)
    if g:
        m[(g.group(1), g.group(2))] = float(g.group(3))
out = []
for k in ("step", "forward", "sample"):
    n, t = m.get((f"muser_{k}_seconds", "count")), m.get((f"muser_{k}_seconds", "sum"))
    if n:
        out.append(f"{k} {1e3 * t / n:.2f} ms x {int(n)}")
print("; " + ", ".join(out) if out else "")
PY
)"
  kill $pid; wait $pid 2>/dev/null
  python3 - "$t0" "$t1" "$*" "$kept" <<'PY' | tee -a "$log"
import json, sys
r = json.load(open("/tmp/answer.json")); t = float(sys.argv[2]) - float(sys.argv[1])
n = r["usage"]["completion_tokens"]
print(f"serve {sys.argv[3] or '(plain)'}: {n} tokens in {t:.2f} s ({n/t:.1f}/s) {sys.argv[4]}")
open("/tmp/answer-" + ("plain" if not sys.argv[3] else "guess") + ".txt", "w").write(r["choices"][0]["text"])
PY
}
serve_once
serve_once --draft-ngram 2 --draft-max 8
cmp -s /tmp/answer-plain.txt /tmp/answer-guess.txt && echo "  the same text" | tee -a "$log" || echo "  texts differ" | tee -a "$log"

# llama-server b11434, the same body, plain and with ngram-simple drafts.
llama_once() {
  llama_serve_start /tmp/llama-serve.log "$@"
  curl -s localhost:8090/v1/completions -H 'content-type: application/json' -d "$body" > /dev/null  # warm
  t0=$(date +%s.%N)
  curl -s localhost:8090/v1/completions -H 'content-type: application/json' -d "$body" > /tmp/answer.json
  t1=$(date +%s.%N)
  llama_serve_stop
  grep -iE "specul|draft|seq_rm|ngram" /tmp/llama-serve.log | head -8 >> "$OUT/llama-serve-tail.log"
  python3 - "$t0" "$t1" "$*" <<'PY' | tee -a "$log"
import json, sys
try:
    r = json.load(open("/tmp/answer.json"))
except Exception as e:
    print(f"llama-server {sys.argv[3] or '(plain)'}: no answer ({e})"); sys.exit()
t = float(sys.argv[2]) - float(sys.argv[1])
n = r.get("usage", {}).get("completion_tokens", 0)
tm = r.get("timings", {})
print(f"llama-server {sys.argv[3] or '(plain)'}: {n} tokens in {t:.2f} s ({n/t:.1f}/s); its timings: predicted {tm.get('predicted_per_second')}/s, draft {tm.get('draft_n')} accepted {tm.get('draft_n_accepted')}")
open("/tmp/answer-llama-" + ("plain" if not sys.argv[3] else "guess") + ".txt", "w").write(r["choices"][0]["text"])
PY
}
if [ -x "$LLAMA_SERVER" ]; then
  llama_once
  llama_once --spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 8
  cmp -s /tmp/answer-llama-plain.txt /tmp/answer-llama-guess.txt && echo "  the same text" | tee -a "$log" || echo "  texts differ" | tee -a "$log"
  tail -5 /tmp/llama-serve.log >> "$OUT/llama-serve-tail.log"
  # LLAMA_TRACE=1: a run at debug verbosity (-lv 5, not timed) for its speculative trace: whether
  # the drafter was set up, how often it was called and found a pattern (what showed, 2026-12-06,
  # why it drafted nothing on the 30B synthetic file's output of one token repeated).
  if [ "${LLAMA_TRACE:-0}" = 1 ]; then
    llama_serve_start /tmp/llama-debug.log -lv 5 --spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 8
    curl -s localhost:8090/v1/completions -H 'content-type: application/json' -d "$body" > /dev/null
    llama_serve_stop
    { echo "== llama-server -lv 5: speculative lines"; grep -ciE "found matching pattern" /tmp/llama-debug.log; grep -ciE "called impl" /tmp/llama-debug.log
      grep -iE "spec |specul|seq_rm|draft" /tmp/llama-debug.log | grep -v "^$" | head -40; } >> "$OUT/llama-serve-tail.log"
  fi
else
  echo "llama-server: not built (carry/llama.tar.xz from scripts/h200-prepare.sh; /tmp/llama-build.log)" | tee -a "$log"
fi
