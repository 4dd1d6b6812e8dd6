#!/usr/bin/env bash
# Greedy tokens of llama-server b11434 and of Muser on the same synthetic 30B file and prompt
# (h200-spec.sh's), carry=["carry"] with carry/llama.tar.xz: where they part, and how often each
# output's last two tokens appeared before (where llama.cpp's ngram-simple with size n 2, or
# `--draft-ngram 2`, finds a guess). Into $OUT/tokens.log.
source "$(dirname "$0")/h200-env.sh"
source "$(dirname "$0")/h200-llama-build.sh"
log="$OUT/tokens.log"
llama_build_start llama-server
N=${TOK_N:-256}
ids=$(spec_prompt_ids)
# Muser, while llama-server builds: the default (accurate) mode, fast, batch-invariant.
i=0
for flags in "--device cuda" "--device cuda --mode fast --fp8-weights" "--device cuda --batch-invariant"; do
  i=$((i + 1))
  timeout 200 carry/bin/muser generate -m "$MODEL" $flags --prompt-ids "$ids" -n "$N" --temp 0 --print-ids \
    > "/tmp/muser-$i.ids" 2> /tmp/gen.err
  echo "muser $flags: rc=$? $(grep -E '^\[' /tmp/gen.err | tail -1)" | tee -a "$log"
done
[ -n "${llama_build:-}" ] && wait "$llama_build"
echo "llama-server build: $(ls "$LLAMA_SERVER" 2>/dev/null || tail -3 /tmp/llama-build.log)" | tee -a "$log"
llama_serve_start /tmp/llama-serve.log
body=$(python3 -c "import json,sys; print(json.dumps({'prompt':[int(x) for x in sys.argv[1].split(',')],'n_predict':$N,'temperature':0,'ignore_eos':True,'return_tokens':True,'cache_prompt':False}))" "$ids")
curl -s localhost:8090/completion -H 'content-type: application/json' -d "$body" > /tmp/llama-answer.json
llama_serve_stop
python3 - "$ids" <<'PY' | tee -a "$log"
import json, sys
prompt = [int(x) for x in sys.argv[1].split(",")]
try:
    llama = [int(t) for t in json.load(open("/tmp/llama-answer.json"))["tokens"]]
except Exception as e:
    print(f"llama-server: no tokens ({e})"); llama = []
runs = {"llama-server": llama}
for i, name in [(1, "muser accurate"), (2, "muser fast"), (3, "muser batch-invariant")]:
    try:
        runs[name] = [int(t) for t in open(f"/tmp/muser-{i}.ids").read().split()]
    except Exception as e:
        print(f"{name}: no tokens ({e})")
def guessable(out):
    # Steps where the last two tokens (prompt and output so far) appeared before: ngram-simple's
    # and --draft-ngram 2's lookup finds a guess there.
    seq, n = prompt + [], 0
    for t in out:
        seq.append(t)
        last = tuple(seq[-2:])
        if any(tuple(seq[j:j + 2]) == last for j in range(len(seq) - 2)):
            n += 1
    return n
for name, out in runs.items():
    print(f"{name:22}: {len(out)} tokens, {len(set(out))} distinct, {guessable(out)} steps with the last two tokens seen before; first 12: {out[:12]}")
for name, out in runs.items():
    if name == "llama-server" or not llama:
        continue
    same = next((i for i, (a, b) in enumerate(zip(out, llama)) if a != b), min(len(out), len(llama)))
    print(f"{name} and llama-server: the same first {same} tokens")
PY
