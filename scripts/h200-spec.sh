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
