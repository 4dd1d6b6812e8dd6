#!/usr/bin/env bash
# Runs on the GPU machine (after scripts/h200-prepare.sh, carry=["carry"]): what products of a few
# tokens cost. Batched decode of 1 to 16 sequences (`muser bench --parallel`, each step's tokens
# drawn on the device), then Nsight Compute on one replayed step of NPLS sequences (kernel by
# kernel, scripts/h200-step.sh) and the stall reasons of the tensor-core products at NCU_NPL
# (scripts/h200-ncu.sh). FLAGS (muser bench flags, default "--mode fast --fp8-weights"),
# PARS (default 1,2,4,8,9,16), NPLS (default 9), NCU_NPL (default 9), NCU_KERNEL (default
# regex:mmq_p2_q4_k).
source "$(dirname "$0")/h200-env.sh"
flags=${FLAGS:---mode fast --fp8-weights}
log="$OUT/smalln.txt"
carry/bin/muser bench -m "$MODEL" --device cuda $flags -p 0 -n 0 --parallel "${PARS:-1,2,4,8,9,16}" \
  --batch-prompt 32 --batch-gen 64 --batch-draw 2>&1 | grep -v "^\s*$" | tail -20 | tee "$log"
for npl in ${NPLS:-9}; do
  NPL=$npl TAG=x$npl FLAGS="$flags" bash "$(dirname "$0")/h200-step.sh" | tail -40 >> "$log"
done
if [ -n "${NCU_NPL:-9}" ]; then
  NPL=${NCU_NPL:-9} FLAGS="$flags" KERNEL=${NCU_KERNEL:-regex:mmq_p2_q4_k} SKIP=${NCU_SKIP:-2} COUNT=${NCU_COUNT:-3} TAG=stalls \
    bash "$(dirname "$0")/h200-ncu.sh" >> "$log"
fi
