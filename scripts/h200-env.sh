# Sourced by the scripts that run on the H200 machine (repo root, carry/bin in place): the output
# folder, the CUDA runtime's libraries, the kernel cache, and the synthetic 30B file (written if
# it is not there yet).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export MUSER_KERNEL_CACHE=/tmp/muser-kernels
MODEL=${MODEL:-/tmp/muse-30b-q4_k_m.gguf}
[ -f "$MODEL" ] || carry/bin/muser synth "$MODEL" --preset 30b --layout q4_k_m > /dev/null
