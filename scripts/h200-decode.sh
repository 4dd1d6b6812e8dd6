#!/usr/bin/env bash
# One-sequence decode on the H200 machine (after scripts/h200-prepare.sh, carry=["carry/bin"]):
# `muser bench` decode for the default and each of DVARIANTS (space-separated, each one or more
# comma-separated VAR=VALUE, e.g. "MUSER_MVQ_SPLIT=0 MUSER_MMQ_PAIR=0"), then (NCU=1) every kernel
# of two replayed decode steps timed by Nsight Compute (graph nodes one by one, clocks left alone),
# summed per kernel name: where a token's time goes inside the graph, without the events' overhead.
source "$(dirname "$0")/h200-env.sh"
B="carry/bin/muser bench -m $MODEL --device cuda -p 0 -n ${TG:-128} -r ${REPS:-3}"
log="$OUT/decode.log"
[ -n "${ONLY_NCU:-}" ] || timeout 200 $B 2>&1 | grep -E '^\| tg' | sed 's/^| /| (default) /' | tee -a "$log"
for v in ${DVARIANTS:-}; do
  env ${v//,/ } timeout 200 $B 2>&1 | grep -E '^\| tg' | sed "s/^| /| ($v) /" | tee -a "$log"
done
if [ -n "${NCU:-}" ]; then
  # A decode step is ~450 launches; skip the load and the first steps, profile about two steps.
  timeout ${NCU_TIMEOUT:-240} ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum \
    --launch-skip ${SKIP:-6000} --launch-count ${COUNT:-900} --csv --page raw \
    carry/bin/muser bench -m "$MODEL" --device cuda -p 0 -n 64 -r 1 > /tmp/ncu-decode.csv 2> /tmp/ncu-decode.err
  python3 - /tmp/ncu-decode.csv <<'PY' | tee -a "$log"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
if not rows:
    print("ncu: no rows"); sys.exit()
print("ncu header:", rows[0][:12], rows[1][:12] if len(rows) > 1 else "", rows[2][:12] if len(rows) > 2 else "")
head = rows[0]
ki, gi, bi, ti = head.index("Kernel Name"), head.index("Grid Size"), head.index("Block Size"), head.index("gpu__time_duration.sum")
tot = collections.defaultdict(lambda: [0, 0.0])
n = 0
for r in rows[2:]:
    try:
        t = float(r[ti].replace(",", ""))
    except ValueError:
        continue
    k = (r[ki].split("(")[0], r[gi], r[bi])
    tot[k][0] += 1
    tot[k][1] += t
    n += 1
unit = rows[1][ti]
all_t = sum(v[1] for v in tot.values())
print(f"ncu: {n} kernels, {all_t:.0f} {unit} in all")
for k, (c, t) in sorted(tot.items(), key=lambda kv: -kv[1][1])[:40]:
    print(f"{k[0]:<28} grid {k[1]:<14} block {k[2]:<12} x{c:<5} {t / c:9.1f} {unit} each, {100 * t / all_t:5.1f}%")
PY
  tail -3 /tmp/ncu-decode.err
fi
