#!/usr/bin/env bash
# Speculative decoding from the sequence's own tokens on the GPU machine (after
# scripts/h200-prepare.sh, carry=["carry"]): `muser generate` greedy, plain and with
# --draft-ngram N --draft-max M (DRAFTS, space-separated N:M), the same prompt and flags
# (GEN_FLAGS), the tokens compared with plain decoding's; then `muser bench` decode for the
# graph's one-token rate in the same call. The synthetic model's random weights make no sense of
# a prompt: its greedy output falls into loops, which is where guesses are kept; the figures say
# how much a kept guess saves, not how often a real model's would be kept.
source "$(dirname "$0")/h200-env.sh"
log="$OUT/spec.log"
FLAGS=${GEN_FLAGS:-"--device cuda --mode fast --fp8-weights"}
N=${GEN_N:-512}
# A prompt with a passage said twice (the lookup finds it in the prompt too).
ids=$(python3 -c 'import random; r=random.Random(5); p=[r.randrange(1000, 30000) for _ in range(200)]; print(",".join(map(str, [1]+p+p)))')
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
# Where the plain run's tokens repeat: the share of steps a perfect guess could skip.
python3 - <<'PY' | tee -a "$log"
t = open("/tmp/plain.out").read().split()
print(f"plain output: {len(t)} tokens, {len(set(t))} distinct; first 40: {' '.join(t[:40])}")
PY
timeout 200 carry/bin/muser bench -m "$MODEL" $FLAGS -p 0 -n 128 -r 2 2>&1 | grep -E '^\| tg' | tee -a "$log"
# The server, one client, the same prompt greedy (SERVE_N tokens), plain and guessing: the time
# of the answer and whether the texts agree.
SN=${SERVE_N:-256}
body=$(python3 -c "import json,sys; print(json.dumps({'prompt':[int(x) for x in sys.argv[1].split(',')],'max_tokens':$SN,'temperature':0}))" "$ids")
serve_once() {
  carry/bin/muser serve -m "$MODEL" $FLAGS --port 8089 --parallel 4 "$@" > /tmp/serve.log 2>&1 &
  pid=$!
  for _ in $(seq 240); do curl -sf localhost:8089/health > /dev/null && break; sleep 1; done
  curl -s localhost:8089/v1/completions -H 'content-type: application/json' -d "$body" > /dev/null  # warm
  t0=$(date +%s.%N)
  curl -s localhost:8089/v1/completions -H 'content-type: application/json' -d "$body" > /tmp/answer.json
  t1=$(date +%s.%N)
  kept=$(curl -s localhost:8089/metrics | grep '^muser_draft_tokens_total' | tr '\n' ' ')
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
