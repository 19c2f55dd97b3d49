"""The instructions in the int4 decode gemv's main loop, read on a machine without a GPU (the
gemv is bound by instruction issue): each variant compiled by NVRTC to an sm_90 cubin and
disassembled by nvdisasm, then every loop (a backward branch to a label) counted by opcode. The
NVRTC and nvdisasm of the CUDA wheels, fetched once:

    python3 -m pip download --no-deps --only-binary=:all: -d /tmp/cuda nvidia-cuda-nvrtc-cu12 \\
        nvidia-cuda-nvdisasm && for w in /tmp/cuda/*.whl; do unzip -q -o $w -d /tmp/cuda/x; done
    python3 bench/sass_count.py --tools /tmp/cuda/x [--shape 37888 3584] [--nf4]

NVRTC 12.9 here; the GPU machine's torch ships another, so counts may differ by a few there.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels import int4_gemv_kernel, int4_mma_kernel  # noqa: E402


def cubin(lib, source: str) -> bytes:
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k", 0, None, None) == 0
    opts = [b"--gpu-architecture=sm_90", b"-default-device", b"--std=c++17"]
    if lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts)):
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(log.value.decode())
    n = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    out = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, out)
    return out.raw


def loops(sass: str) -> list[collections.Counter]:
    """The opcodes of each loop: from a label to the backward branch to it."""
    at, body, label = {}, [], None
    for line in sass.splitlines():
        if m := re.match(r"^\s*\.L_x_(\d+):", line):
            label = m.group(1)
        if m := re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line):
            addr = int(m.group(1), 16)
            if label is not None:
                at[label], label = addr, None
            body.append((addr, m.group(2).strip()))
    found = []
    for addr, ins in body:
        m = re.search(r"BRA.*\.L_x_(\d+)", ins)
        if m and at.get(m.group(1), addr + 1) < addr:
            found.append(collections.Counter(
                re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0]
                for a, i in body if at[m.group(1)] <= a <= addr))
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tools", required=True, help="where the wheels were unzipped")
    p.add_argument("--shape", type=int, nargs=2, default=(37888, 3584), metavar=("N", "K"))
    p.add_argument("--nf4", action="store_true")
    args = p.parse_args()
    tools = Path(args.tools)
    lib = ctypes.CDLL(str(next(tools.rglob("libnvrtc.so*"))))
    nvdisasm = str(next(tools.rglob("nvdisasm")))
    N, K = args.shape
    G = 64 if args.nf4 else 128
    v = dict(int4_gemv_kernel.variant(G, N, K, args.nf4), CODEBOOK=int(args.nf4))
    source = int4_mma_kernel._COMMON + int4_mma_kernel._HELPERS + int4_gemv_kernel.source(v)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin(lib, source))
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    print(v)
    for ops in loops(sass):  # the main loop holds two k-groups (two register sets in turn)
        print(sum(ops.values()), "instructions:", dict(ops.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
