"""What one kernel can read from a GPU's memory in the time of a decode step's layer (issue
28): a plain streaming read (16-byte loads, U in flight a lane, the values xor-ed and written
only if impossible) over the bytes of each 7B int4 layer, in CUDA-graph replays cycling through
copies larger than the L2, as int4_mma.py times the products. The ceiling the int4 kernels are
measured against, per layer size and grid.

    python3 bench/read_ceiling.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from awq_speed import SHAPES  # noqa: E402  (beside this script)
from graph_timing import time_us  # noqa: E402
from sweep_log import cycling  # noqa: E402

from engine.platform import nvrtc  # noqa: E402

SOURCE = r"""
#ifndef T_MAJOR
#define T_MAJOR 1
#endif
extern "C" __global__ void read_all(const uint4* __restrict__ p, unsigned int* __restrict__ out,
                                    int n, int flag) {
    unsigned int acc = 0;
    const int stride = gridDim.x * blockDim.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = __ldg(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) { uint4 v = __ldg(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    if (acc == (unsigned int)flag) out[0] = acc;
}

/* The int4 kernels' order: block T reads the 16-byte pieces of row tile T's KJ k-groups of 512
   bytes, warp w every S-th; T_MAJOR: the tile's k-groups adjacent ([NT][KJ][32]), else the
   row tiles of one k-group adjacent ([KJ][NT][32]) */
extern "C" __global__ void read_tiles(const uint4* __restrict__ p, unsigned int* __restrict__ out,
                                      int KJ, int flag) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, S = blockDim.x >> 5;
    const int T = blockIdx.x, NT = gridDim.x;
    unsigned int acc = 0;
    for (int j = w; j < KJ; j += S) {
        const uint4 v = __ldg(p + (T_MAJOR ? ((size_t)T * KJ + j) : ((size_t)j * NT + T)) * 32
                              + lane);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == (unsigned int)flag) out[0] = acc;
}
"""


def main() -> None:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = torch.zeros(1, dtype=torch.int32, device=dev)
    print("| shape | MB | U | blocks x threads | us | GB/s |")
    print("|---|---|---|---|---|---|")
    for name, N, K in SHAPES["qwen2.5-7b"]:
        nbytes = N * K // 2 + (K // 128) * N * 4
        n16 = nbytes // 16
        copies = [torch.randint(0, 2**30, (n16, 4), dtype=torch.int32, device=dev)
                  for _ in range(max(1, min(24, (400 << 20) // nbytes)))]
        best = None
        for U in (2, 4, 8):
            k = nvrtc.compiled("read_all", f"#define U {U}\n" + SOURCE, "ppii", 0)
            for per_sm, threads in ((4, 256), (8, 256), (16, 128), (2, 1024)):
                blocks = sms * per_sm
                fn = cycling(lambda c, k=k, b=blocks, t=threads: k(
                    grid=(b, 1, 1), block=(t, 1, 1), args=[c, out, n16, 1]), copies)  # noqa: B023
                us = time_us(fn, 2 * len(copies))
                row = (us, U, f"{blocks} x {threads}")
                best = row if best is None or us < best[0] else best
                print(f"| {name} | {nbytes / 1e6:.1f} | {U} | {blocks} x {threads} | "
                      f"{us:.2f} | {nbytes / us / 1e3:.0f} |", flush=True)
        for t_major in (1, 0):
            k = nvrtc.compiled("read_tiles", f"#define U 1\n#define T_MAJOR {t_major}\n" + SOURCE,
                               "ppii", 0)
            for warps in (4, 8):
                fn = cycling(lambda c, k=k, w=warps: k(grid=(N // 16, 1, 1), block=(32 * w, 1, 1),  # noqa: B023, E501
                                                       args=[c, out, K // 64, 1]), copies)  # noqa: B023
                us = time_us(fn, 2 * len(copies))
                print(f"| {name} tiles {'T-major' if t_major else 'j-major'} | "
                      f"{N * K / 2e6:.1f} | - | {N // 16} x {32 * warps} | {us:.2f} | "
                      f"{N * K / 2 / us / 1e3:.0f} |", flush=True)
        print(f"| **{name} best** | {nbytes / 1e6:.1f} | {best[1]} | {best[2]} | {best[0]:.2f} | "
              f"{nbytes / best[0] / 1e3:.0f} |", flush=True)
        del copies
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
