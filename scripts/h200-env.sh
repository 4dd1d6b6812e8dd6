# Sourced by the scripts that run on the H200 machine (repo root, carry/bin or carry/bin.tar.xz):
# the output folder, the CUDA runtime's libraries, the kernel cache, the binaries unpacked, and
# the synthetic 30B file (written if it is not there yet).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export MUSER_KERNEL_CACHE=/tmp/muser-kernels
# carry/kernels (or carry/kernels.tar.xz): PTX written here by `ptx --cache` (NVRTC from PyPI): read instead of compiled
# where the machine's NVRTC has the same major.minor version (the cache key).
[ -d carry/kernels ] || { [ -f carry/kernels.tar.xz ] && tar -C carry -xJf carry/kernels.tar.xz; }
if [ -d carry/kernels ]; then
  mkdir -p "$MUSER_KERNEL_CACHE" && cp -n carry/kernels/*.ptx "$MUSER_KERNEL_CACHE"/ 2>/dev/null
  echo "kernel cache: $(ls carry/kernels | wc -l) carried programs; the machine's NVRTC: $(ls /usr/local/cuda-13.0/targets/x86_64-linux/lib/ | grep -o 'libnvrtc.so.13[.0-9]*' | sort -u | tr '\n' ' ')"
fi
MODEL=${MODEL:-/tmp/muse-30b-q4_k_m.gguf}
# The binaries, if they came as carry/bin.tar.xz; the synth time to SYNTH_LOG, if set.
[ -x carry/bin/muser ] || tar -C carry -xJf carry/bin.tar.xz
[ -f "$MODEL" ] || { /usr/bin/time -f "synth %e s" carry/bin/muser synth "$MODEL" --preset 30b --layout q4_k_m --force 2>&1 | tail -2 | tee -a "${SYNTH_LOG:-/dev/null}"; }
# One load run's line (crates/server/tests/load/load.py --out FILE) under LABEL, to stdout and $log.
serve_summary() {
  python3 - "$1" "$2" <<'PY' | tee -a "$log"
import json, sys
r = json.load(open(sys.argv[1])); t = r["ttft_ms"]
print(f"{sys.argv[2]:22}: ok {r['requests_ok']} failed {r['requests_failed']} {r['failures']} completion tokens/s {r['tokens_per_s']} "
      f"ttft p50 {t['p50']} ms p99 {t['p99']} ms, engine step {r.get('step_ms_mean')} ms "
      f"(forward {r.get('forward_ms_mean')}, sampling {r.get('sample_ms_mean')})")
PY
}
# The speculative runs' prompt (h200-spec.sh, h200-llama-tokens.sh): BOS and a passage of 200 random
# token ids said twice (a lookup finds it in the prompt too), comma-separated.
spec_prompt_ids() {
  python3 -c 'import random; r=random.Random(5); p=[r.randrange(1000, 30000) for _ in range(200)]; print(",".join(map(str, [1]+p+p)))'
}
