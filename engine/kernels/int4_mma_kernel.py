"""A CUDA C++ int4 product on the tensor cores for the "mma" layout (quant/int4_tile_layout.py),
for up to 64 rows of x (verification, a batch; a decode step's few rows go through
kernels/int4_gemv_kernel.py, longer inputs kernels/int4_dequant_kernel.py and cuBLAS); bf16.
Compiled by NVRTC once per process and variant, launched through platform/nvrtc.py (no nvcc or
host compiler needed, unlike Triton).

out^T [N, M] = W [N, K] x^T: W is the m16n8k16 product's A operand, dequantized in registers from
one 32-bit word a lane a tile ((w >> 4i) & 0x000F000F | 0x43004300 is the bf16 pair 128 + q, less
136 is q - 8 exactly, one bf16 fma with the scale and offset rounds once), x^T is B (8 rows of x a
product, zeros past M), accumulation in fp32. A warp takes R row tiles (16 rows each) and every
S-th k-group of 64 of its block's share of K (the small layers' K is split across SPLITS blocks,
their fp32 partials added by a second launch in split order); the block's S warps sum in shared
memory in a fixed order. So a row's bits do not depend on the other rows, on MT, or on the run
(R, S and SPLITS come from the layer's shape alone).
W[n, k] = (q - 8) scale + offset with SZ [K/G, N, 2] bf16, as in quant/int4_linear.py.
"""

from __future__ import annotations

import functools

import torch

from engine.platform import nvrtc

MMA_MAX_ROWS = 64

_COMMON = r"""
typedef unsigned int u32;
typedef unsigned short u16;


__device__ __forceinline__ u16 to_bf16(float f) {  // round to nearest even (finite inputs)
    u32 u = __float_as_uint(f);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

__device__ __forceinline__ u32 nibble_pair(u32 v) {  // (v & 0x000F000F) | 0x43004300
    u32 t;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(t) : "r"(v), "r"(0x000F000Fu), "r"(0x43004300u));
    return t;
}
"""

_HELPERS = r"""
__device__ __forceinline__ u32 bf16x2_fma(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                         u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

#define ONE2 0x3F803F80u    /* bf16 (1, 1) */
#define M136 0xC308C308u    /* bf16 (-136, -136) */

/* One word's A fragment, (q - 8) scale + offset rounded once: lo and hi the bf16 (scale, offset)
   pairs of rows g and g + 8 (a0 and a2 are row g's registers, a1 and a3 row g + 8's) */
__device__ __forceinline__ void affine_a(u32 v, u32 lo, u32 hi, u32 (&a)[4]) {
    const u32 sl = (lo & 0xFFFFu) | (lo << 16), ol = (lo >> 16) | (lo & 0xFFFF0000u);
    const u32 sh = (hi & 0xFFFFu) | (hi << 16), oh = (hi >> 16) | (hi & 0xFFFF0000u);
    a[0] = bf16x2_fma(bf16x2_fma(nibble_pair(v), ONE2, M136), sl, ol);
    a[1] = bf16x2_fma(bf16x2_fma(nibble_pair(v >> 4), ONE2, M136), sh, oh);
    a[2] = bf16x2_fma(bf16x2_fma(nibble_pair(v >> 8), ONE2, M136), sl, ol);
    a[3] = bf16x2_fma(bf16x2_fma(nibble_pair(v >> 12), ONE2, M136), sh, oh);
}
"""

_MMA = r"""
/* Grid (row tile blocks, splits): split s takes k-groups [s KJ / splits, (s + 1) KJ / splits); with
   one split the block writes bf16 out, else fp32 partials [splits, M, N] that int4_mma_sum adds
   in split order. */
extern "C" __global__ void __launch_bounds__(S * 32)
int4_mma(const u16* __restrict__ x, const uint4* __restrict__ w, const u32* __restrict__ sz,
         u16* __restrict__ out, float* __restrict__ partials, int M, int N, int K, int stride_x,
         int stride_sz, int stride_out) {
#if PARALLEL_SUM
    __shared__ float part[S][R * MT * 4][32];
#else
    __shared__ float part[1][R * MT * 4][32];
#endif
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int T0 = blockIdx.x * R, NT = N >> 4, KJ = K >> 6;
    const int splits = gridDim.y, split = blockIdx.y;
    const int j_lo = (int)((long long)split * KJ / splits);
    const int j_hi = (int)((long long)(split + 1) * KJ / splits);
    float acc[R][MT][4];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[r][mt][i] = 0.f;

    /* U k-groups a warp at once: their weights and scales are loaded before any is used, so U
       memory latencies overlap (a warp has only a handful of k-groups in a layer) */
    for (int j0 = j_lo + warp; j0 < j_hi; j0 += S * U) {
        uint4 wq[U][R];
        u32 s_lo[U][R][NS], s_hi[U][R][NS];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * S < j_hi ? j0 + u * S : j0;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int T = T0 + r < NT ? T0 + r : NT - 1;
                wq[u][r] = __ldg(w + ((size_t)T * KJ + j) * 32 + lane);
#pragma unroll
                for (int q = 0; q < NS; q++) {  /* the groups of scales in these 64 k */
                    const u32* p = sz + (size_t)((j * 64 + q * G) / G) * stride_sz + (T << 4) + g;
                    s_lo[u][r][q] = __ldg(p);
                    s_hi[u][r][q] = __ldg(p + 8);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * S;
            if (j >= j_hi) break;  /* the same for the whole warp */
            u32 b[4][MT][2];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                /* x's fragments, in the layout's order of k: row m's k of words 2h and 2h + 1 are
                   the 16 bytes at 64 j + 32 h + 8 t; a few rows' for all 64 k at once (one
                   latency), else per 32 k */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if (MT <= 2 ? c == 0 : c == 2 * h) {
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            const int m = mt * 8 + g;
                            uint4 xv = make_uint4(0u, 0u, 0u, 0u);
                            if (m < M)
                                xv = __ldg(reinterpret_cast<const uint4*>(
                                    x + (size_t)m * stride_x + (j << 6) + 32 * h + 8 * t));
                            b[2 * h][mt][0] = xv.x;
                            b[2 * h][mt][1] = xv.y;
                            b[2 * h + 1][mt][0] = xv.z;
                            b[2 * h + 1][mt][1] = xv.w;
                        }
                    }
                }
                const int q = (16 * c) / G < NS ? (16 * c) / G : 0;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const uint4 wv = wq[u][r];
                    const u32 v = c == 0 ? wv.x : c == 1 ? wv.y : c == 2 ? wv.z : wv.w;
                    u32 a[4];
                    affine_a(v, s_lo[u][r][q], s_hi[u][r][q], a);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
                        mma16816(acc[r][mt], a[0], a[1], a[2], a[3], b[c][mt][0], b[c][mt][1]);
                }
            }
        }
    }
    /* the warps' sums added in warp order: all at once where shared memory holds them, else one
       warp at a time (slower: S barriers); either way ((w0 + w1) + w2) + ..., the same bits */
#if PARALLEL_SUM
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < 4; i++) part[warp][(r * MT + mt) * 4 + i][lane] = acc[r][mt][i];
    __syncthreads();
#else
    for (int s = 0; s < S; s++) {
        if (warp == s) {
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        float* p = &part[0][(r * MT + mt) * 4 + i][lane];
                        *p = s == 0 ? acc[r][mt][i] : *p + acc[r][mt][i];
                    }
        }
        __syncthreads();
    }
#endif
    for (int idx = threadIdx.x; idx < R * MT * 4 * 32; idx += S * 32) {
        const int l = idx & 31, ri = idx >> 5;
        const int i = ri & 3, mt = (ri >> 2) % MT, r = (ri >> 2) / MT;
#if PARALLEL_SUM
        float v = part[0][ri][l];
#pragma unroll
        for (int s = 1; s < S; s++) v += part[s][ri][l];
#else
        const float v = part[0][ri][l];
#endif
        /* C fragment: (row g + 8 (i >> 1), column 2t + (i & 1)) of the 16 x 8 tile */
        const int n = ((T0 + r) << 4) + (l >> 2) + 8 * (i >> 1);
        const int m = mt * 8 + 2 * (l & 3) + (i & 1);
        if (m >= M || n >= N) continue;
        if (splits == 1) out[(size_t)m * stride_out + n] = to_bf16(v);
        else partials[((size_t)split * M + m) * N + n] = v;
    }
}
"""

_SUM = r"""
extern "C" __global__ void int4_mma_sum(const float* __restrict__ partials, u16* __restrict__ out,
                                        int M, int N, int splits, int stride_out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    float v = 0.f;
    for (int s = 0; s < splits; s++) v += partials[(size_t)s * M * N + i];
    out[(size_t)(i / N) * stride_out + i % N] = to_bf16(v);
}
"""


def compiled(name: str, source: str, kinds: str, device_index: int, pdl: bool = False
             ) -> nvrtc.Kernel:
    """`pdl`: a programmatic dependent where nvrtc.pdl_wanted (the load's pdl setting)."""
    return _compiled(name, source, kinds, device_index, pdl and nvrtc.pdl_wanted(device_index))


@functools.cache  # keyed by the module's own source strings, whose hashes Python keeps
def _compiled(name: str, source: str, kinds: str, device_index: int, pdl: bool) -> nvrtc.Kernel:
    return nvrtc.compiled(name, _COMMON + _HELPERS + source, kinds, device_index, pdl)


def variant(rows: int, G: int, N: int, K: int) -> dict:
    """Launch constants: MT products of 8 rows for `rows` rows of x; R row tiles a warp, S warps a
    block, SPLITS blocks along K from the shape alone (a row's sum order never depends on the rows
    beside it). `bench/int4_mma.py`'s sweep found R = 2, S = 8 best or near it at one row at
    every 7B shape, 4 splits of K best below 1,024 row tiles (q/k/v, o, down)."""
    mt = 1 if rows <= 8 else (2 if rows <= 16 else (4 if rows <= 32 else 8))
    splits = 4 if N // 16 < 1024 and K // 64 >= 32 else 1
    return dict(R=2, S=8, MT=mt, G=G, SPLITS=splits, U=2 if mt <= 2 else 1)


def source(v: dict) -> str:
    parallel = v["S"] * v["R"] * v["MT"] * 4 * 32 * 4 <= 48 * 1024  # static shared memory
    return ("".join(f"#define {k} {int(v[k])}\n" for k in ("R", "S", "MT", "G", "U"))
            + f"#define NS {max(1, 64 // v['G'])}\n"
            + f"#define PARALLEL_SUM {int(parallel)}\n" + _MMA)


def matmul(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, G: int,
           launch: dict | None = None) -> torch.Tensor:
    """x [M, K] bf16 (M <= 64) @ W^T -> [M, N] bf16; packed [N/16, K/64, 32, 4] int32; sz
    [K/G, N, 2] bf16 with unit stride over n (a fused layer's member may be a column view)."""
    M, K = x.shape
    N = packed.shape[0] * 16
    index = x.device.index or 0
    v, product = _plan(M, G, N, K, index) if launch is None else (launch, None)
    if (M > 8 * v["MT"] or K % 64 or (64 % G and G % 64) or sz.stride(1) != 2
            or sz.stride(2) != 1):
        raise ValueError(f"the int4 mma kernel takes up to {8 * v['MT']} rows of K % 64 == 0, "
                         f"not {M}x{K}")
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.contiguous()
    out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    splits = v["SPLITS"]
    partials = out if splits == 1 else torch.empty(splits, M, N, dtype=torch.float32,
                                                    device=x.device)
    (product or _product(tuple(sorted(v.items())), index))(
        grid=(-(-(N // 16) // v["R"]), splits, 1), block=(32 * v["S"], 1, 1),
        args=[x, packed, sz, out, partials, M, N, K, x.stride(0), sz.stride(0) // 2, N])
    if splits > 1:  # the same code for every variant: compiled once
        compiled("int4_mma_sum", _SUM, "ppiiii", index)(
            grid=(-(-(M * N) // 256), 1, 1), block=(256, 1, 1),
            args=[partials, out, M, N, splits, N])
    return out


@functools.cache
def _product(variant: tuple, device_index: int) -> nvrtc.Kernel:
    return compiled("int4_mma", source(dict(variant)), "pppppiiiiii", device_index)


@functools.lru_cache(maxsize=1024)
def _plan(rows: int, G: int, N: int, K: int, device_index: int) -> tuple[dict, nvrtc.Kernel]:
    """(variant, its compiled product), looked up by eager calls (the host bounds a prefill)."""
    v = variant(rows, G, N, K)
    return v, _product(tuple(sorted(v.items())), device_index)
