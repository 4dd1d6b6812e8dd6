#!/usr/bin/env python3
"""Registers, spills and shared memory of each kernel of one source file, from NVRTC's ptxas
(`--ptxas-options=-v`), without a GPU: the occupancy a launch can reach, before a device call.

    LD_LIBRARY_PATH=DIR python3 tools/nvrtc_regs.py matvec [sm_90] [-DNAME=VALUE ...]

DIR holds libnvrtc.so.13 and its builtins (the `nvidia-cuda-nvrtc` wheel, as .ci/run installs
it). The source is crates/cuda/kernels/FILE.cu with common.cuh in front, compiled as
kernels.rs compiles it (C++17, -default-device) but to a cubin for the named architecture.
Prints one line per kernel: name, registers, and ptxas's remarks (spills, barriers, smem).
"""
import ctypes
import os
import re
import sys


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    name, rest = argv[0], argv[1:]
    arch = rest.pop(0) if rest and rest[0].startswith("sm_") else "sm_90"
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "cuda", "kernels")
    src = open(os.path.join(here, "common.cuh")).read() + "\n" + open(os.path.join(here, name + ".cu")).read()
    lib = ctypes.CDLL("libnvrtc.so.13")
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 0, None, None) != 0:
        print("nvrtcCreateProgram failed")
        return 1
    opts = ["--std=c++17", "-default-device", f"--gpu-architecture={arch}", "--ptxas-options=-v"] + rest
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, buf)
    log = buf.value.decode(errors="replace")
    if rc != 0:
        print(log)
        return 1
    kernel, spill = None, ""
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            kernel, spill = m.group(1), ""
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = f"spills {m.group(1)}/{m.group(2)} B"
        m = re.search(r"Used (\d+) registers(.*)", line)
        if m and kernel:
            print(f"{kernel:40s} {m.group(1):>4s} registers {spill:>18s} {m.group(2).strip(' ,')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
