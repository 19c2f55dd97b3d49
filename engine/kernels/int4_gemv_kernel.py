"""A CUDA C++ int4 product for a decode step's 1 to GEMV_MAX_ROWS rows of x over the "mma" layout
(quant/int4_tile_layout.py), with int4_mma's arithmetic (kernels/int4_mma_kernel.py: weights
dequantized in registers, the tensor cores' m16n8k16 product, fp32 sums) but a decode step's
grid: one block a row tile of 16 outputs, all of the tile's split of K in that block and summed
there (no second launch), the next k-groups loaded while these are used, and as many warps a
tile as make the small layers fill the GPU. Compiled by NVRTC, launched by platform/nvrtc.py.

A row's bits do not depend on the rows beside it (the split comes from the layer's shape alone),
but they are not int4_mma's: a batch that grows past GEMV_MAX_ROWS rows changes a row's last bits.
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import int4_mma_kernel as mma
from engine.kernels.int4_dequant_kernel import codebook_source
from engine.platform import nvrtc

GEMV_MAX_ROWS = 4  # at 8 rows int4_mma was as fast or faster on three of a 7B's four
# products on the H200, at 1-4 the gemv on all four (BENCHMARKS.md; 5-7 not measured)

_GEMV = r"""
/* Grid: one block a row tile (16 output rows); SPLITS x S warps a block. Warp (s, w) takes the
   k-groups j_lo(s) + w + S i < j_hi(s) of split s; the block sums ((w0 + w1) + ...) per split,
   then 0 + split 0 + split 1 + ... PIPE: the next U k-groups' weights and scales are loaded
   before these U are used. */
#if CODEBOOK
typedef u16 scale_t;  /* the NF4 absmax [K/64, N] */
#else
typedef u32 scale_t;  /* AWQ's (scale, offset) [K/G, N, 2] */
#endif

__device__ __forceinline__ void load_items(const uint4* wt, const scale_t* st, int stride_sz, int j,
                                           int j_hi, uint4 (&wq)[U], u32 (&lo)[U][NS],
                                           u32 (&hi)[U][NS]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int ju = j + u * S;
        if (ju < j_hi) {
            wq[u] = __ldg(wt + (size_t)ju * 32);
#pragma unroll
            for (int q = 0; q < NS; q++) {
                const scale_t* p = st + (size_t)((ju * 64 + q * G) / G) * stride_sz;
                lo[u][q] = __ldg(p);
                hi[u][q] = __ldg(p + 8);
            }
        }
    }
}

__device__ __forceinline__ void use_items(const u16* xr, bool has_row, int j, int j_hi,
                                          const uint4 (&wq)[U], const u32 (&lo)[U][NS],
                                          const u32 (&hi)[U][NS], float (&acc)[4],
                                          const u32* tab) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int ju = j + u * S;
        if (ju >= j_hi) break;  /* the same for the whole warp */
        u32 b[4][2];  /* x's B fragments for the 64 k: row g of x, zeros past M */
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const u16* p = xr + (ju << 6) + (c << 4);
            b[c][0] = has_row ? __ldg(reinterpret_cast<const u32*>(p)) : 0u;
            b[c][1] = has_row ? __ldg(reinterpret_cast<const u32*>(p + 8)) : 0u;
        }
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int q = (16 * c) / G < NS ? (16 * c) / G : 0;
            const u32 v = c == 0 ? wq[u].x : c == 1 ? wq[u].y : c == 2 ? wq[u].z : wq[u].w;
            u32 a[4];
#if CODEBOOK  /* code absmax, rounded once (fma with -0) */
            const u32 l = lo[u][q], h = hi[u][q];
            const u32 sl = l | (l << 16), sh = h | (h << 16), z = 0x80008000u;
            a[0] = bf16x2_fma(code_pair(tab, v), sl, z);
            a[1] = bf16x2_fma(code_pair(tab, v >> 4), sh, z);
            a[2] = bf16x2_fma(code_pair(tab, v >> 8), sl, z);
            a[3] = bf16x2_fma(code_pair(tab, v >> 12), sh, z);
#else
            affine_a(v, lo[u][q], hi[u][q], a);
#endif
            mma16816(acc, a[0], a[1], a[2], a[3], b[c][0], b[c][1]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(SPLITS * S * 32)
int4_gemv(const u16* __restrict__ x, const uint4* __restrict__ w, const u32* __restrict__ sz,
          u16* __restrict__ out, int M, int N, int K, int stride_x, int stride_sz,
          int stride_out) {
    __shared__ float part[SPLITS * S][4][32];
#if CODEBOOK
    __shared__ u32 tab[16];
    load_codes(tab);
#else
    const u32* tab = nullptr;
#endif
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int split = warp / S, ws = warp % S;
    const int T = blockIdx.x, KJ = K >> 6;
    const int j_lo = (int)((long long)split * KJ / SPLITS);
    const int j_hi = (int)((long long)(split + 1) * KJ / SPLITS);
    const uint4* wt = w + (size_t)T * KJ * 32 + lane;
    const scale_t* st = reinterpret_cast<const scale_t*>(sz) + (T << 4) + g;
    const bool has_row = g < M;
    const u16* xr = x + (size_t)(has_row ? g : 0) * stride_x + 2 * t;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    uint4 wq[U];
    u32 lo[U][NS], hi[U][NS];
    int j = j_lo + ws;
    load_items(wt, st, stride_sz, j, j_hi, wq, lo, hi);
    for (; j < j_hi; j += S * U) {
#if PIPE
        uint4 nq[U];
        u32 nlo[U][NS], nhi[U][NS];
        load_items(wt, st, stride_sz, j + S * U, j_hi, nq, nlo, nhi);
        use_items(xr, has_row, j, j_hi, wq, lo, hi, acc, tab);
#pragma unroll
        for (int u = 0; u < U; u++) {
            wq[u] = nq[u];
#pragma unroll
            for (int q = 0; q < NS; q++) { lo[u][q] = nlo[u][q]; hi[u][q] = nhi[u][q]; }
        }
#else
        use_items(xr, has_row, j, j_hi, wq, lo, hi, acc, tab);
        load_items(wt, st, stride_sz, j + S * U, j_hi, wq, lo, hi);
#endif
    }
#pragma unroll
    for (int i = 0; i < 4; i++) part[warp][i][lane] = acc[i];
    __syncthreads();
    for (int idx = threadIdx.x; idx < 128; idx += SPLITS * S * 32) {
        const int l = idx & 31, i = idx >> 5;
        const int m = 2 * (l & 3) + (i & 1);  /* C fragment: row g + 8 (i >> 1), column m */
        if (m >= M) continue;
        float total = 0.f;
#pragma unroll
        for (int s = 0; s < SPLITS; s++) {
            float v = part[s * S][i][l];
#pragma unroll
            for (int ww = 1; ww < S; ww++) v += part[s * S + ww][i][l];
            total += v;
        }
        out[(size_t)m * stride_out + (T << 4) + (l >> 2) + 8 * (i >> 1)] = to_bf16(total);
    }
}
"""


def variant(G: int, N: int, K: int) -> dict:
    """Launch constants from the layer's shape alone: W = S x SPLITS warps a row tile, so that
    the grid holds about 4,096 warps (the small q/k/v, o and down products of a 7B fill the H200's
    132 SMs) but at least 4 and at most 16, S <= 8 of them sharing one split of K. U k-groups a
    warp at once, PIPE: the next U loaded while these are used. The H200's sweeps (BENCHMARKS.md,
    issue 28) found these best or within 0.7 us of the best at every 7B shape."""
    want = max(4, 4096 // max(1, N // 16))
    W = min(16, 1 << (want.bit_length() - 1))  # a power of two: 4, 8 or 16
    S = min(8, W)
    return dict(S=S, SPLITS=W // S, G=G, U=1, PIPE=1)


def source(v: dict) -> str:
    return ("".join(f"#define {k} {int(v[k])}\n" for k in ("S", "SPLITS", "G", "U", "PIPE"))
            + f"#define NS {max(1, 64 // v['G'])}\n"
            + codebook_source(bool(v.get("CODEBOOK"))) + _GEMV)


@functools.cache
def _product(v: tuple, device_index: int) -> nvrtc.Kernel:
    return mma.compiled("int4_gemv", source(dict(v)), "ppppiiiiii", device_index)


@functools.lru_cache(maxsize=256)
def _plan(G: int, N: int, K: int, codebook: bool, device_index: int
          ) -> tuple[dict, nvrtc.Kernel]:
    """(variant, its compiled product), looked up once per shape (eager calls are host-bound)."""
    v = dict(variant(G, N, K), CODEBOOK=int(codebook))
    return v, _product(tuple(sorted(v.items())), device_index)


def matmul(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, G: int,
           launch: dict | None = None, codebook: bool = False) -> torch.Tensor:
    """x [M, K] bf16 (M <= GEMV_MAX_ROWS; up to 8 with `launch`) @ W^T -> [M, N] bf16; packed
    [N/16, K/64, 32, 4] int32; sz [K/G, N, 2] bf16 (scale, offset), or with `codebook` the NF4
    absmax [K/64, N] bf16; unit stride over n either way (a fused layer's member is a view)."""
    M, K = x.shape
    N = packed.shape[0] * 16
    index = x.device.index or 0
    if launch is None:
        v, product = _plan(G, N, K, codebook, index)
    else:
        v, product = dict(launch, CODEBOOK=int(codebook)), None
    scale_ok = sz.stride(1) == 1 if codebook else (sz.stride(1) == 2 and sz.stride(2) == 1)
    if M > (8 if launch else GEMV_MAX_ROWS) or K % 64 or (64 % G and G % 64) or not scale_ok:
        raise ValueError(f"the int4 gemv kernel takes up to {GEMV_MAX_ROWS} rows of K % 64 == 0 "
                         f"and scales of unit stride over n, not {M}x{K} with scale strides "
                         f"{tuple(sz.stride())}")
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.contiguous()
    out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    (product or _product(tuple(sorted(v.items())), index))(
        grid=(N // 16, 1, 1), block=(32 * v["S"] * v["SPLITS"], 1, 1),
        args=[x, packed, sz, out, M, N, K, x.stride(0),
              sz.stride(0) if codebook else sz.stride(0) // 2, N])
    return out
