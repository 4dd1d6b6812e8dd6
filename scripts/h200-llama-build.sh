# Sourced on the GPU machine: llama_build_start TARGET... builds llama.cpp b11434's TARGETs (CUDA,
# sm_90) from carry/llama.tar.xz in /tmp/llama, niced, in the background, and sets llama_build to its
# pid (wait on it); nothing when carry/llama.tar.xz did not come or the targets are built.
llama_build_start() {
  local t missing=
  for t in "$@"; do [ -x "/tmp/llama/llama.cpp/build/bin/$t" ] || missing=1; done
  [ -f carry/llama.tar.xz ] && [ -n "$missing" ] || return 0
  ( mkdir -p /tmp/llama && { [ -d /tmp/llama/llama.cpp ] || tar -C /tmp/llama -xJf carry/llama.tar.xz; } && cd /tmp/llama/llama.cpp &&
    cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF > /tmp/llama-build.log 2>&1 &&
    nice -n 19 cmake --build build -j$(( $(nproc) > 3 ? $(nproc) - 2 : 1 )) --target "$@" >> /tmp/llama-build.log 2>&1 ) &
  llama_build=$!
}
