#!/usr/bin/env bash
# Runs on the H200 machine (repo root, after scripts/h200-prepare.sh here, carry=["carry"]).
# Stages (select with STAGES, default all): tests, synth, muser, batch (Muser's batched test and
# llama-batched-bench on the same file; FAST=1 adds Muser's --mode fast), llama, tp (needs 2+
# GPUs); serve (not in the default: 64 streaming clients against `muser serve` (SERVE_FLAGS, e.g.
# "--mode fast") and then `llama-server -np 64`).
# Logs go to $OUT; the last lines printed are a short table.
set -uo pipefail
# The binaries come compressed (h200-prepare.sh).
[ -f carry/bin.tar.xz ] && tar -C carry -xJf carry/bin.tar.xz
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# AUX: where the build, synth and server logs go (default $OUT; elsewhere, only their last lines
# come back in $OUT/aux-tails.log: the device tool returns 8 files at most).
AUX=${AUX:-$OUT}
mkdir -p "$AUX"
STAGES=${STAGES:-"tests synth muser batch llama"}
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export MUSER_KERNEL_CACHE=/tmp/muser-kernels
MODEL=${MODEL:-/tmp/muse-30b-q4_k_m.gguf}
has() { [[ " $STAGES " == *" $1 "* ]]; }
# llama_build_start (llama.cpp built from carry/llama.tar.xz).
source "$(dirname "$0")/h200-llama-build.sh"
# The server comparison (serve): wait for /health; the chat template both servers get (the
# synthetic file has none); 64 streaming clients, 128 tokens per request (ignore_eos).
up() { for _ in $(seq 120); do curl -sf "$1/health" > /dev/null && return 0; sleep 1; done; return 1; }
tmpl=crates/text/tests/data/muse-glimmer.jinja
# /v1/completions: llama-server parses chat output with the template's own grammar, which the
# random weights' text fails (every request an error, 2026-11-29), so both get plain text.
load_summary() {
  [ -f "$1" ] && python3 - "$1" <<'PY' | tee -a "$OUT/serve.log"
import json, sys
r = json.load(open(sys.argv[1]))
t = r["ttft_ms"]
print(f"{sys.argv[1]}: ok {r['requests_ok']} failed {r['requests_failed']} {r['failures']} completion tokens/s {r['tokens_per_s']} ttft p50 {t['p50']} ms p99 {t['p99']} ms, engine step {r.get('step_ms_mean')} ms (forward {r.get('forward_ms_mean')} ms, sampling {r.get('sample_ms_mean')} ms)")
PY
  summary+=("$(grep -E "$1" "$OUT/serve.log" | tail -1)")
}
# SERVE_TURNS=N: conversations of N requests (prefix reuse; SERVE_FLAGS=--no-prefix-reuse for the
# other half of an A/B).
# SERVE_SCHEMA: a JSON schema every output must satisfy (llama.cpp's json_schema field, both servers).
# (A schema without spaces: the command line is split on them.)
LOAD_ANY="python3 crates/server/tests/load/load.py --clients 64 --ignore-eos --min-tokens 128 --max-tokens 128 --endpoint completions --turns ${SERVE_TURNS:-1}"
LOAD_PLAIN="$LOAD_ANY --duration ${SERVE_SECONDS:-60}"
LOAD="$LOAD_PLAIN ${SERVE_SCHEMA:+--json-schema $SERVE_SCHEMA}"
summary=()
export NCCL_NVLS_ENABLE=0
# NCCL for tensor parallelism: the runtime (PyTorch's nvidia-nccl wheel here) ships libnccl.so.2
# only; cudarc loads libnccl.so, so a link to it goes into a folder on the library path.
nccl=$(find $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) /usr/lib /usr/local -name 'libnccl.so.2' 2>/dev/null | head -1)
if [ -n "$nccl" ]; then
  mkdir -p /tmp/nccl-link && ln -sf "$nccl" /tmp/nccl-link/libnccl.so
  export LD_LIBRARY_PATH=/tmp/nccl-link:$(dirname "$nccl"):$LD_LIBRARY_PATH
  echo "NCCL: $nccl"
fi
n_gpu=$(nvidia-smi -L | grep -c '^GPU')
# llama.cpp spreads a model over every GPU it sees: its runs get GPU 0 only (CUDA_VISIBLE_DEVICES),
# as Muser's single-GPU runs use GPU 0.

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"

# llama.cpp builds on the CPU while the tests run and the synthetic file is written; the timed
# stages wait for it.
# NO_LLAMA=1: Muser's halves only (no llama.cpp build, no llama.cpp runs).
llama_too() { [ -z "${NO_LLAMA:-}" ] && { has llama || has batch || has serve; }; }
# Whether the prebuilt llama-bench starts (it loads the CUDA libraries); if this machine's
# libstdc++ is older than the build machine's, with the one that came along (compat/).
llama_runs() {
  local b=/tmp/llama/llama.cpp/build/bin
  "$b/llama-bench" --help > /dev/null 2>&1 && return 0
  cp /tmp/llama/compat/* "$b/" 2>/dev/null && "$b/llama-bench" --help > /dev/null 2>&1 && return 0
  echo "llama.cpp: the prebuilt binaries do not start here: $("$b/llama-bench" --help 2>&1 | head -2)" | tee -a "$AUX/llama-build.log"
  rm -rf /tmp/llama
  return 1
}
# (A machine still warm from an earlier call keeps its build: then it is reused.)
if llama_too && { ! has llama || [ -x /tmp/llama/llama.cpp/build/bin/llama-bench ]; } && { ! has batch || [ -x /tmp/llama/llama.cpp/build/bin/llama-batched-bench ]; } && { ! has serve || [ -x /tmp/llama/llama.cpp/build/bin/llama-server ]; }; then
  echo "llama.cpp: reusing the build in /tmp/llama" | tee -a "$AUX/llama-build.log"
  true & llama_build=$!
elif llama_too && [ -f carry/llama-bin.tar.xz ] && tar -C / -xJf carry/llama-bin.tar.xz && llama_runs; then
  # Built beforehand by scripts/llama-prebuild.sh (the same sources and CMake options, nvcc 13.0
  # from PyPI, in /tmp/llama so its run paths hold here): no compile on this machine. If they do
  # not start here, they are compiled from carry/llama.tar.xz as before.
  echo "llama.cpp: prebuilt binaries from carry/llama-bin.tar.xz" | tee -a "$AUX/llama-build.log"
  true & llama_build=$!
elif llama_too; then
  LLAMA_BUILD_LOG="$AUX/llama-build.log" llama_build_start $(has llama && echo llama-bench) $(has batch && echo llama-batched-bench) $(has serve && echo llama-server)
fi

if has tests; then
  # TESTS_FILTER: only the tests whose names contain it (the test binary's filter).
  MUSER_FIXTURES=tests/fixtures timeout 400 carry/bin/gpu-tests ${TESTS_FILTER:-} --nocapture --test-threads 1 2>&1 | tee "$OUT/gpu-tests.log"
  summary+=("gpu tests: $(grep -E '^test result' "$OUT/gpu-tests.log" | tail -1)")
  # PDL_TESTS=1: again with the one-token products launched the ordinary way (MUSER_PDL=0).
  if [ -n "${PDL_TESTS:-}" ]; then
    echo "==== MUSER_PDL=0" >> "$OUT/gpu-tests.log"
    MUSER_PDL=0 MUSER_FIXTURES=tests/fixtures timeout 400 carry/bin/gpu-tests --nocapture --test-threads 1 >> "$OUT/gpu-tests.log" 2>&1
    summary+=("gpu tests, MUSER_PDL=0: $(grep -E '^test result' "$OUT/gpu-tests.log" | tail -1)")
  fi
fi

if has synth; then
  /usr/bin/time -f "synth: %e s" carry/bin/muser synth "$MODEL" --preset 30b --layout q4_k_m --force 2>&1 | tee "$AUX/synth.log"
fi

# Every timing runs after the llama.cpp build: a compile beside it takes the host's cores and
# memory from the process that launches the GPU work (the tests and the synthetic file do not
# mind).
if llama_too; then
  # (No pid: carry/llama.tar.xz did not come.)
  wait "${llama_build:-}" 2> /dev/null || echo "llama.cpp build failed (see llama-build.log)"
fi

if has muser; then
  # Accurate mode (the default): prompts and decode; then --mode fast (two-plane activations in
  # the int8 kernels) for prompts and for decode after 4k and 32k tokens of context (filled
  # quickly); with AB=1 also the previous one-token kernels (MUSER_MVQ=0) and the fused FFN
  # kernel (MUSER_FUSE=1) for comparison.
  B="carry/bin/muser bench -m $MODEL --device cuda"
  log="$OUT/muser-bench.log"; : > "$log"
  timeout 300 $B -p ${PP:-512,2048} -n ${TG:-128} --depth ${DEPTH:-0,4096} -r ${REPS:-3} ${BENCH_FLAGS:-} 2>&1 | tee -a "$log"
  [ -n "${QUICK:-}" ] || timeout 300 $B --mode fast -p ${PP:-512,2048} -n ${TG:-128} --depth ${DEEP:-4096,32768} -r 1 2>&1 | tee -a "$log"
  # QUICK with FAST=1: fast mode's prompts and decode at the start of the context.
  # FAST_FLAGS: more flags for the fast runs (e.g. --f16-weights).
  [ -z "${QUICK:-}" ] || [ -z "${FAST:-}" ] || timeout 300 $B --mode fast ${FAST_FLAGS:-} -p ${PP:-512,2048} -n ${TG:-128} -r ${REPS:-3} 2>&1 | tee -a "$log"
  if [ -n "${AB:-}" ]; then
    MUSER_MVQ=0 timeout 300 $B -p 0 -n ${TG:-128} -r ${REPS:-3} 2>&1 | sed 's/^| tg/| (MUSER_MVQ=0) tg/' | tee -a "$log"
    MUSER_FUSE=1 timeout 300 $B -p 0 -n ${TG:-128} -r ${REPS:-3} 2>&1 | sed 's/^| tg/| (MUSER_FUSE=1) tg/' | tee -a "$log"
  fi
  summary+=("$(grep -E '^\| (pp|tg|\(MUSER)|^model' "$log" | sed 's/^/muser /')")
fi

if has batch; then
  # Batched decode like llama-batched-bench -npp 512 -ntg 128 -npl 32,64: Muser, then (with
  # BI=1) its batch-invariant mode.
  blog="$OUT/batched.log"; : > "$blog"
  # (FAST_ONLY=1: the fast run alone.)
  [ -n "${FAST_ONLY:-}" ] || timeout 240 carry/bin/muser bench -m "$MODEL" --device cuda -p 0 -n 0 --parallel ${NPL:-32,64} ${BATCH_FLAGS:-} 2>&1 | tee -a "$blog"
  # FAST=1: the same in --mode fast (two-plane tensor-core kernels for products of several tokens).
  [ -z "${FAST:-}" ] || timeout 240 carry/bin/muser bench -m "$MODEL" --device cuda --mode fast ${FAST_FLAGS:-} -p 0 -n 0 --parallel ${NPL:-32,64} 2>&1 | sed 's/^| /| (fast) /' | tee -a "$blog"
  # Variants at 64 sequences for comparison (VARIANTS: space-separated entries, each one or more
  # comma-separated VAR=VALUE, e.g. "MUSER_MMQ_PLANES=2 MUSER_MMQ_PLANES=2,MUSER_MMQ_OCC=2"; AB=1
  # adds the classic ones). Each is one `muser bench` with that environment.
  variants=${VARIANTS:-}
  [ -n "${AB:-}" ] && variants="$variants MUSER_MMQ=0 MUSER_MMQ_NT=2"
  for v in $variants; do
    env ${v//,/ } timeout 200 carry/bin/muser bench -m "$MODEL" --device cuda -p 0 -n 0 --parallel ${VNPL:-64} 2>&1 | sed "s/^| /| ($v) /" | tee -a "$blog"
  done
  if [ -n "${BI:-}" ]; then
    timeout 200 carry/bin/muser bench -m "$MODEL" --device cuda --batch-invariant -p 512 -n ${TG:-128} -r 1 --parallel 64 2>&1 | sed 's/^| /| (invariant) /' | tee -a "$blog"
  fi
fi

if has ncu; then
  # Where the batched step's time goes: one launch of the tensor-core kernel (64 tokens) and of
  # the cuBLAS path for comparison.
  for k in ${NCU_KERNELS:-mmq_s_q4_k_4 xq_planes}; do
    echo "=== $k" | tee -a "$OUT/ncu.log"
    timeout 150 ncu --clock-control none --kernel-name "$k" --launch-skip 60 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats \
      carry/bin/muser bench -m "$MODEL" --device cuda -p 0 -n 0 --parallel 64 --batch-prompt 64 --batch-gen 2 2>&1 |
      grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|No Eligible|Eligible Warps|Issued Warp|Executed Ipc Active|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Mem Pipes Busy|Issue Slots Busy|SM Busy|est. speedup|is stalled|on average|Block Size|Grid Size" | head -45 | tee -a "$OUT/ncu.log"
  done
fi

if has tp && [ "$n_gpu" -ge 2 ]; then
  # Tensor parallelism: the same file at 2 (and 4) ranks (1 rank: the muser stage), prompt and
  # decode (recorded steps, NCCL inside the graphs). TP_FLAGS: a second run with these flags
  # (e.g. "--mode fast --f16-weights").
  for n in 2 4; do
    [ "$n" -le "$n_gpu" ] || continue
    timeout 300 carry/bin/muser bench -m "$MODEL" --device cuda --tensor-parallel $n -p ${PP:-512} -n ${TG:-128} -r ${REPS:-3} 2>&1 | tee "$OUT/muser-tp$n.log"
    [ -z "${TP_FLAGS:-}" ] || timeout 300 carry/bin/muser bench -m "$MODEL" --device cuda --tensor-parallel $n ${TP_FLAGS} -p ${PP:-512} -n ${TG:-128} -r ${REPS:-3} 2>&1 | tee -a "$OUT/muser-tp$n.log"
    summary+=("$(grep -E '^\| (pp|tg)|^model' "$OUT/muser-tp$n.log" | sed "s/^/muser TP x$n /")")
  done
fi



if has serve; then
  # The issue's server comparison: 64 concurrent streaming chat clients for SERVE_SECONDS, every
  # request generating 128 tokens (ignore_eos), first against Muser, then llama-server, same file.
  rm -f /tmp/load-muser.json
  carry/bin/muser serve -m "$MODEL" --device cuda ${SERVE_FLAGS:-} --parallel 64 --ctx-size 1024 --port 8081 --alias muser --chat-template-file $tmpl > "$AUX/serve-muser.log" 2>&1 &
  spid=$!
  if up http://127.0.0.1:8081; then
    # SERVE_WARM=S: S seconds of the same load first, not counted (NVRTC compiles the kernels a
    # fresh machine has not cached during the first requests).
    [ -z "${SERVE_WARM:-}" ] || timeout 300 $LOAD_ANY --duration $SERVE_WARM ${SERVE_SCHEMA:+--json-schema $SERVE_SCHEMA} --url http://127.0.0.1:8081 --model muser > /dev/null 2>&1
    timeout 300 $LOAD --url http://127.0.0.1:8081 --model muser --server-pid $spid --out /tmp/load-muser.json 2>&1 | tail -15 | sed 's/^/muser serve: /' | tee -a "$OUT/serve.log"
    # SERVE_PLAIN_TOO=1 (with SERVE_SCHEMA): the same load unconstrained too, on the same server.
    if [ -n "${SERVE_PLAIN_TOO:-}" ] && [ -n "${SERVE_SCHEMA:-}" ]; then
      timeout 300 $LOAD_PLAIN --url http://127.0.0.1:8081 --model muser --server-pid $spid --out /tmp/load-muser-plain.json 2>&1 | tail -15 | sed 's/^/muser serve (unconstrained): /' | tee -a "$OUT/serve.log"
    fi
  else echo "muser serve did not come up" | tee -a "$OUT/serve.log"; fi
  kill $spid; wait $spid 2>/dev/null
  load_summary /tmp/load-muser.json
  [ -f /tmp/load-muser-plain.json ] && load_summary /tmp/load-muser-plain.json
fi

if has batch && [ -z "${NO_LLAMA:-}" ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 240 /tmp/llama/llama.cpp/build/bin/llama-batched-bench -m "$MODEL" -ngl 99 -c 42000 -b 2048 -ub 512 \
    -npp 512 -ntg 128 -npl ${NPL:-32,64} 2>&1 | grep -E '^\|' | tee -a "$blog"
  summary+=("$(grep -E '^\|' "$blog" | sed 's/^/batched /')")
fi

if has serve && [ -z "${NO_LLAMA:-}" ]; then
  rm -f /tmp/load-llama.json
  CUDA_VISIBLE_DEVICES=0 /tmp/llama/llama.cpp/build/bin/llama-server -m "$MODEL" -ngl 99 -np 64 -c 65536 --port 8082 --chat-template-file $tmpl > "$AUX/serve-llama.log" 2>&1 &
  lpid=$!
  if up http://127.0.0.1:8082; then
    timeout 300 $LOAD --url http://127.0.0.1:8082 --model llama --usage-from-chunks --server-pid $lpid --out /tmp/load-llama.json 2>&1 | tail -15 | sed 's/^/llama-server: /' | tee -a "$OUT/serve.log"
  else echo "llama-server did not come up" | tee -a "$OUT/serve.log"; fi
  kill $lpid; wait $lpid 2>/dev/null
  load_summary /tmp/load-llama.json
fi


if has llama && [ -z "${NO_LLAMA:-}" ]; then
  LB="env CUDA_VISIBLE_DEVICES=0 /tmp/llama/llama.cpp/build/bin/llama-bench"
  timeout 300 $LB -m "$MODEL" -ngl 99 -p ${PP:-512,2048} -n ${TG:-128} -r ${REPS:-3} 2>&1 | tee "$OUT/llama-bench.log"
  # (With QUICK, only when LDEPTH names the depths.)
  { [ -z "${QUICK:-}" ] || [ -n "${LDEPTH:-}" ]; } && timeout 300 $LB -m "$MODEL" -ngl 99 -p 0 -n ${TG:-128} -d ${LDEPTH:-4096,32768} -r 1 2>&1 | tee -a "$OUT/llama-bench.log"
  summary+=("$(grep -E 'pp|tg' "$OUT/llama-bench.log" | grep -v '^|  *model' | sed 's/^/llama.cpp /')")
fi


# Ratios Muser / llama.cpp for the tests both ran (Muser's accurate and fast runs separately).
if [ -f "$OUT/muser-bench.log" ] && [ -f "$OUT/llama-bench.log" ]; then
  ratios=$(python3 - "$OUT/muser-bench.log" "$OUT/llama-bench.log" <<'PY'
import re, sys
muser, mode = {}, "accurate"
for line in open(sys.argv[1]):
    if line.startswith("model:"):
        mode = "fast" if "fast" in line else "accurate"
    m = re.match(r"\|\s*((?:pp|tg)\S*(?: @ d\d+)?)\s*\|\s*([\d.]+)", line)
    if m:
        muser[(mode, m.group(1))] = float(m.group(2))
llama = {}
for line in open(sys.argv[2]):
    cells = [c.strip() for c in line.split("|")]
    if len(cells) > 7 and re.match(r"(pp|tg)", cells[6]):
        llama[cells[6]] = float(cells[7].split()[0])
for (mode, test), v in sorted(muser.items()):
    if test in llama:
        print(f"ratio {test} ({mode}): muser {v:.1f} / llama.cpp {llama[test]:.1f} = {v / llama[test]:.2f}")
PY
)
  summary+=("$ratios")
fi

echo
echo "==== summary ===="
printf '%s\n' "${summary[@]}"
if [ "$AUX" != "$OUT" ]; then
  for f in "$AUX"/*; do [ -f "$f" ] && { echo "=== $f"; tail -25 "$f"; }; done > "$OUT/aux-tails.log"
fi
