#!/usr/bin/env bash
# The CUDA anchor on the H200 machine, after scripts/h200-run.sh built llama.cpp b11434 in /tmp/llama:
# tests/fixtures/llama_logits.c linked with that CUDA build runs every fixture on the GPU (--ngl 99)
#   ub1:   one token per llama_decode (its decode kernels), flash attention auto (llama.cpp's default),
#          f16 cache, then 32 greedy tokens;
#   ub512: the whole prompt in one llama_decode, flash attention off, f16 cache (the settings of the
#          committed CPU goldens llama-kv_f16.f32, so the two builds of llama.cpp compare directly);
# into $LLAMA_CUDA (default /tmp/llama-cuda/<fixture>/), packed into $OUT/llama-cuda.tar.xz; then
# gpu.rs `llama_cuda_anchor_report` compares Muser's CUDA decode with them.
set -uo pipefail
OUT=${OUT:-/tmp/out}
L=/tmp/llama/llama.cpp
LLAMA_CUDA=${LLAMA_CUDA:-/tmp/llama-cuda}
lib=$(dirname "$(find "$L/build" -name 'libllama.so' | head -1)")
gl=$(dirname "$(find "$L/build" -name 'libggml.so' | head -1)")
cc -O2 -std=c11 -o /tmp/llama_logits tests/fixtures/llama_logits.c -I$L/include -I$L/ggml/include \
  -L"$lib" -L"$gl" -lllama -lggml -lggml-base -Wl,-rpath,"$lib" -Wl,-rpath,"$gl" -lm || { echo "llama_logits did not build"; exit 1; }
for m in tests/fixtures/models/*.gguf; do
  name=$(basename "$m" .gguf); d="$LLAMA_CUDA/$name"; mkdir -p "$d"
  tok=tests/fixtures/golden/$name/tokens.i32
  CUDA_VISIBLE_DEVICES=0 /tmp/llama_logits -m "$m" -t "$tok" -o "$d/llama-cuda-ub1-kv_f16.f32" --kv-type f16 --ubatch 1 \
    --ngl 99 --flash-attn auto --greedy 32 --greedy-out "$d/llama-cuda-greedy-kv_f16.i32" > "$d/ub1.log" 2>&1 || echo "$name ub1 failed"
  CUDA_VISIBLE_DEVICES=0 /tmp/llama_logits -m "$m" -t "$tok" -o "$d/llama-cuda-ub512-kv_f16.f32" --kv-type f16 --ubatch 512 \
    --ngl 99 --flash-attn off > "$d/ub512.log" 2>&1 || echo "$name ub512 failed"
done
grep -h "config:" "$LLAMA_CUDA"/tame-f32/ub1.log "$LLAMA_CUDA"/tame-f32/ub512.log
tar -C "$LLAMA_CUDA" -cJf "$OUT/llama-cuda.tar.xz" .
MUSER_LLAMA_CUDA="$LLAMA_CUDA" MUSER_FIXTURES=tests/fixtures timeout 300 carry/bin/gpu-tests llama_cuda_anchor --nocapture --test-threads 1 2>&1 | tee "$OUT/llama-parity.log"
# The first diverging tensor (DUMP=1): llama.cpp's CUDA build and Muser's CUDA cuda-parity and
# accurate modes dump every tensor of tame-q8_0's decode steps; tools/compare_dumps.py reports
# where each departs from llama.cpp.
if [ -n "${DUMP:-}" ]; then
  f=${DUMP_FIXTURE:-tame-q8_0}
  m=tests/fixtures/models/$f.gguf; tok=tests/fixtures/golden/$f/tokens.i32
  rm -rf /tmp/dump-llama /tmp/dump-cuda /tmp/dump-accurate
  CUDA_VISIBLE_DEVICES=0 /tmp/llama_logits -m "$m" -t "$tok" -o /tmp/ll.f32 --kv-type f16 --ubatch 1 \
    --ngl 99 --flash-attn auto --dump-tensors /tmp/dump-llama > /tmp/dump-llama.log 2>&1
  for mode in cuda-parity accurate; do
    carry/bin/muser logits -m "$m" --tokens "$tok" --out /tmp/mu.f32 --ubatch 1 --kv-type f16 --ctx-size 256 \
      --device cuda --mode $mode --dump-tensors /tmp/dump-${mode%%-*} > /dev/null 2>&1
  done
  { echo "== $f: cuda-parity vs llama.cpp CUDA"; python3 tools/compare_dumps.py /tmp/dump-llama /tmp/dump-cuda --show 30
    echo "== $f: accurate vs llama.cpp CUDA"; python3 tools/compare_dumps.py /tmp/dump-llama /tmp/dump-accurate --show 30; } \
    | tee "$OUT/first-divergence.log"
fi
