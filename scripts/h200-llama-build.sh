# Sourced by the scripts that run llama.cpp b11434 on the GPU machine (h200-run.sh, h200-spec.sh,
# h200-llama-tokens.sh).
#
# llama_build_start TARGET... builds llama.cpp's TARGETs (CUDA, sm_90) from carry/llama.tar.xz in
# /tmp/llama, niced, in the background, logging to $LLAMA_BUILD_LOG (default /tmp/llama-build.log),
# and sets llama_build to its pid (wait on it); nothing when carry/llama.tar.xz did not come or the
# targets are built.
llama_build_start() {
  local t missing= log=${LLAMA_BUILD_LOG:-/tmp/llama-build.log}
  for t in "$@"; do [ -x "/tmp/llama/llama.cpp/build/bin/$t" ] || missing=1; done
  [ -f carry/llama.tar.xz ] && [ -n "$missing" ] || return 0
  ( mkdir -p /tmp/llama && { [ -d /tmp/llama/llama.cpp ] || tar -C /tmp/llama -xJf carry/llama.tar.xz; } && cd /tmp/llama/llama.cpp &&
    cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF > "$log" 2>&1 &&
    nice -n 19 cmake --build build -j$(( $(nproc) > 3 ? $(nproc) - 2 : 1 )) --target "$@" >> "$log" 2>&1 ) &
  llama_build=$!
}

# The llama-server these scripts run: $LLAMA_SERVER (default the one built above) with
# $LLAMA_FLAGS (default "-ngl 99"; the CPU: "-t 2").
LLAMA_SERVER=${LLAMA_SERVER:-/tmp/llama/llama.cpp/build/bin/llama-server}
LLAMA_FLAGS=${LLAMA_FLAGS:-"-ngl 99"}

# llama_serve_start LOG ARG...: llama-server on $MODEL with one slot, 8,192 positions and port 8090,
# ARGs after, its output to LOG; returns once it answers /health (or after 240 s), llama_pid its
# pid. llama_serve_stop ends it.
llama_serve_start() {
  local log=$1
  shift
  CUDA_VISIBLE_DEVICES=0 "$LLAMA_SERVER" -m "$MODEL" $LLAMA_FLAGS -np 1 -c 8192 --port 8090 "$@" > "$log" 2>&1 &
  llama_pid=$!
  for _ in $(seq 240); do curl -sf localhost:8090/health > /dev/null && break; sleep 1; done
}
llama_serve_stop() {
  kill "$llama_pid"
  wait "$llama_pid" 2>/dev/null
}
