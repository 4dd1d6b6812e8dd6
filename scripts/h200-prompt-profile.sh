#!/usr/bin/env bash
# On the GPU machine (after scripts/h200-prepare.sh here, carry=["carry"]): where a prompt's time
# goes, operation by operation (`muser bench --profile`: CUDA events around each operation, eager,
# one prompt after an untimed one), in the modes named in MODES (default: accurate, then fast with
# FP8 prompt products) for the prompt lengths in PP (default 512 2048) on the synthetic 30B.
# Labels starting "(inside) " are parts of the operation around them (the accurate mode's f16
# products: the weights' dequantization to f16, the main product, the cross product), left out
# of the total.
source scripts/h200-env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
for mode in ${MODES:-accurate fast}; do
  flags="--mode $mode"
  [ "$mode" = fast ] && flags="$flags --fp8-weights"
  for np in ${PP:-512 2048}; do
    log="$OUT/profile-$mode-$np.log"
    carry/bin/muser bench -m "$MODEL" --device cuda $flags -p "$np" -n 0 -r 2 --profile > "$log" 2>&1
    echo "== $mode, prompt $np"
    grep -E "^\| pp" "$log"
    sed -n '/per prompt of/,$p' "$log" | head -24
  done
done
