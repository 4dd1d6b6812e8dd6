#!/usr/bin/env python3
"""Where two forward passes part: compare tensor dumps of the same tokens, by (call, name).

  compare_dumps.py REF_DIR OTHER_DIR [--rel 1e-6] [--show 20]

Each DIR holds index.tsv and raw little-endian f32 files, as written by
`tests/fixtures/llama_logits.c --dump-tensors DIR` (llama.cpp; columns file, call, name, op, type,
ne0..ne3) or `muser logits --dump-tensors DIR` (columns file, call, name, values). Tensors present
in both with the same number of values are compared (flat, ne0 fastest = Muser's row-major
[tokens][width]); the report lists them in the order of OTHER's dump with the largest absolute
difference relative to REF's largest magnitude, and marks the first that exceeds --rel: the first
diverging tensor. Standard library only.
"""
import argparse
import array
import os
import sys


def load_index(d):
    rows = []
    with open(os.path.join(d, "index.tsv")) as f:
        head = f.readline().rstrip("\n").split("\t")
        for line in f:
            cells = line.rstrip("\n").split("\t")
            r = dict(zip(head, cells))
            rows.append((int(r["call"]), r["name"], r["file"]))
    return rows


def values(d, fname):
    a = array.array("f")
    with open(os.path.join(d, fname), "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ref")
    p.add_argument("other")
    p.add_argument("--rel", type=float, default=1e-6)
    p.add_argument("--show", type=int, default=20)
    a = p.parse_args()
    ref = {(c, n): f for c, n, f in load_index(a.ref)}
    shown, first = 0, None
    for call, name, f in load_index(a.other):
        rf = ref.get((call, name))
        if rf is None:
            continue
        x, y = values(a.ref, rf), values(a.other, f)
        if len(x) != len(y):
            print(f"call {call:3d} {name:<18} sizes differ ({len(x)} vs {len(y)})")
            continue
        scale = max((abs(v) for v in x if v == v), default=0.0) or 1.0
        diff = max((abs(u - v) for u, v in zip(x, y)), default=0.0)
        rel = diff / scale
        mark = ""
        if rel > a.rel and first is None:
            first = (call, name, rel)
            mark = "  <- first beyond --rel"
        if shown < a.show or mark:
            print(f"call {call:3d} {name:<18} max |diff| {diff:.3e}  / max |ref| {scale:.3e} = {rel:.3e}{mark}")
            shown += 1
    if first is None:
        print(f"no tensor differs by more than {a.rel:g} of its largest value")
    else:
        print(f"first diverging tensor: call {first[0]} {first[1]} ({first[2]:.3e})")


if __name__ == "__main__":
    main()
