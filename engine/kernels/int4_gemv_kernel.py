"""A CUDA C++ int4 product for a decode step's 1 to GEMV_MAX_ROWS rows of x over the "mma" layout
(quant/int4_tile_layout.py), with int4_mma's arithmetic (kernels/int4_mma_kernel.py: weights
dequantized in registers, the tensor cores' m16n8k16 product, fp32 sums) but a decode step's
grid: one block a row tile of 16 outputs, all of the tile's split of K in that block and summed
there (no second launch), the next k-group loaded while this one is used, and as many warps a
tile as make the small layers fill the GPU. x's share of a k-group is two 16-byte loads (the
layout's k order). NF4 (CODEBOOK) looks its codes up without memory reads for half of a
k-group's words (byte permutes, kernels/int4_dequant_kernel.py code_word) and in a shared table
of code pairs for the other half, so that neither the ALU nor the shared-memory pipe is alone in
the way. Compiled by NVRTC, launched by platform/nvrtc.py.

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
# products, at 1-4 the gemv on all four (5-7 not measured)

_GEMV = r"""
/* Grid: one block a row tile (16 output rows); SPLITS x S warps a block. Warp (s, w) takes the
   k-groups j_lo(s) + w + S i < j_hi(s) of split s, the next one's weights, scales (and with XPRE
   x's fragments) loaded while this one is used (two register sets in turn: no copies); the block
   sums ((w0 + w1) + ...) per split, then 0 + split 0 + split 1 + ...; GLU: the block's up tile
   too (T + N / 32), and SiLU(gate) * up written (N / 2 outputs) */
#if CODEBOOK
typedef u16 scale_t;  /* the NF4 absmax [K/64, N] */
#else
typedef u32 scale_t;  /* AWQ's (scale, offset) [K/G, N, 2] */
#endif

/* One k-group of a lane: its 16 bytes of codes, its rows' scales, and x's B fragments in the
   layout's k order: row g's 16 bytes at 64 j + 8 t (words 0, 1) and at 64 j + 32 + 8 t (words 2,
   3), zeros past M (never loaded: both sets start at zero) */
struct Item {
    uint4 w, x0, x1;
    u32 lo[NS], hi[NS];
#if GLU  /* the up projection's row tile, beside the gate's: the same x */
    uint4 w2;
    u32 lo2[NS], hi2[NS];
#endif
};

__device__ __forceinline__ void load_x(const uint4* xp, bool has_row, Item& it) {
    if (has_row) {
        it.x0 = __ldg(xp);
        it.x1 = __ldg(xp + 4);
    }
}

__device__ __forceinline__ void load_item(const uint4* wp, const scale_t* sp, int stride_sz,
                                          const uint4* xp, bool has_row, bool live, Item& it,
                                          size_t up_w, int up_s) {
#if XPRE
    load_x(xp, live && has_row, it);
#endif
    if (!live) return;
    it.w = __ldg(wp);
#pragma unroll
    for (int q = 0; q < NS; q++) {  /* groups of 32: two in a k-group */
        it.lo[q] = __ldg(sp + q * stride_sz);
        it.hi[q] = __ldg(sp + q * stride_sz + 8);
    }
#if GLU
    it.w2 = __ldg(wp + up_w);
#pragma unroll
    for (int q = 0; q < NS; q++) {
        it.lo2[q] = __ldg(sp + up_s + q * stride_sz);
        it.hi2[q] = __ldg(sp + up_s + q * stride_sz + 8);
    }
#endif
}

/* the shared table's entry at byte offset off: pairs is 1 KB aligned, so its address or'ed with
   the offset (one lop3 with the mask) is the entry's; volatile, so that the compiler keeps it
   after the barrier that follows the table's filling (the SASS is the same either way) */
__device__ __forceinline__ u32 pair_at(u32 pairs, u32 off) {
    u32 d;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(d) : "r"(off | pairs));
    return d;
}

/* word c of a lane's 16 bytes of codes -> its A fragment, dequantized */
__device__ __forceinline__ void weights_a(u32 v, u32 l, u32 h, int c, u32 pairs, u32 (&a)[4]) {
#if CODEBOOK  /* code absmax, rounded once (fma with -0) */
    const u32 sl = l | (l << 16), sh = h | (h << 16), z = 0x80008000u;
    if (c < LUT) {  /* a register's pair of codes is byte i of the word: one shared load */
        a[0] = pair_at(pairs, (v << 2) & 0x3FCu);
#pragma unroll
        for (int i = 1; i < 4; i++) a[i] = pair_at(pairs, (v >> (8 * i - 2)) & 0x3FCu);
    } else {
        code_word(v, a);
    }
    a[0] = bf16x2_fma(a[0], sl, z);
    a[1] = bf16x2_fma(a[1], sh, z);
    a[2] = bf16x2_fma(a[2], sl, z);
    a[3] = bf16x2_fma(a[3], sh, z);
#else
    affine_a(v, l, h, a);
#endif
}

__device__ __forceinline__ u32 word(const uint4& w, int c) {
    return c == 0 ? w.x : c == 1 ? w.y : c == 2 ? w.z : w.w;
}

__device__ __forceinline__ void use_item(const uint4* xp, bool has_row, Item& it,
                                         float (&acc)[2][4], u32 pairs) {
#if !XPRE
    load_x(xp, has_row, it);
#endif
    const u32 b[4][2] = {{it.x0.x, it.x0.y}, {it.x0.z, it.x0.w}, {it.x1.x, it.x1.y},
                         {it.x1.z, it.x1.w}};
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const int q = (16 * c) / G < NS ? (16 * c) / G : 0;
        u32 a[4];
        weights_a(word(it.w, c), it.lo[q], it.hi[q], c, pairs, a);
        mma16816(acc[0], a[0], a[1], a[2], a[3], b[c][0], b[c][1]);
#if GLU
        weights_a(word(it.w2, c), it.lo2[q], it.hi2[q], c, pairs, a);
        mma16816(acc[1], a[0], a[1], a[2], a[3], b[c][0], b[c][1]);
#endif
    }
}

/* SiLU(gate) * up as kernels/fused_ops_kernel.py's _silu_mul computes it: both bf16 first,
   e^-g as ex2.approx of -g log2 e (its tl.math.exp2), a rounded division, SiLU rounded before
   its product */
__device__ __forceinline__ u16 silu_mul(float gate, float up) {
    const float g = __uint_as_float((u32)to_bf16(gate) << 16);
    const float u = __uint_as_float((u32)to_bf16(up) << 16);
    float e;
    asm("ex2.approx.f32 %0, %1;" : "=f"(e) : "f"(-g * 1.4426950408889634f));
    const float s = __uint_as_float((u32)to_bf16(__fdiv_rn(g, 1.f + e)) << 16);
    return to_bf16(s * u);
}

/* one output's sum over the block's warps: ((w0 + w1) + ...) per split, then 0 + split 0 + ... */
__device__ __forceinline__ float block_sum(const float (*part)[4 * (1 + GLU)][32], int i, int l) {
    float total = 0.f;
#pragma unroll
    for (int s = 0; s < SPLITS; s++) {
        float v = part[s * S][i][l];
#pragma unroll
        for (int ww = 1; ww < S; ww++) v += part[s * S + ww][i][l];
        total += v;
    }
    return total;
}

extern "C" __global__ void __launch_bounds__(SPLITS * S * 32)
int4_gemv(const u16* __restrict__ x, const uint4* __restrict__ w, const u32* __restrict__ sz,
          u16* __restrict__ out, int M, int N, int K, int stride_x, int stride_sz,
          int stride_out) {
    __shared__ float part[SPLITS * S][4 * (1 + GLU)][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int split = warp / S, ws = warp % S;
    const int T = blockIdx.x, KJ = K >> 6;
    /* GLU: this block's up tile is T + N / 32 (the second half of a fused [gate; up]) */
    const size_t up_w = (size_t)(N >> 5) * KJ * 32;
    const int up_s = N >> 1;
    const int j_lo = (int)((long long)split * KJ / SPLITS);
    const int j_hi = (int)((long long)(split + 1) * KJ / SPLITS);
    const bool has_row = g < M;
    int j = j_lo + ws;
    /* k-group j's words, scales and x; a step of S k-groups is S * 64 / G groups (host-checked) */
    const uint4* wp = w + ((size_t)T * KJ + j) * 32 + lane;
    const scale_t* sp = reinterpret_cast<const scale_t*>(sz) + (size_t)(j * 64 / G) * stride_sz
                        + (T << 4) + g;
    const uint4* xp = reinterpret_cast<const uint4*>(x + (size_t)(has_row ? g : 0) * stride_x)
                      + j * 8 + t;
    const size_t s_step = (size_t)(S * 64 / G) * stride_sz;
    float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#if CODEBOOK && LUT
    /* the 256 pairs of codes a byte of the codebook order holds (shared loads at random lanes
       conflict, byte permutes fill the ALU: LUT of the 4 words a k-group go through the table) */
    __shared__ __align__(1024) u32 table[256];
    for (int b = threadIdx.x; b < 256; b += SPLITS * S * 32) {
        u32 a[4];
        code_word((u32)b, a);
        table[b] = a[0];
    }
    __syncthreads();
    const u32 pairs = (u32)__cvta_generic_to_shared(table);
#else
    const u32 pairs = 0u;
#endif
    Item cur, nxt;
    cur.x0 = cur.x1 = nxt.x0 = nxt.x1 = make_uint4(0u, 0u, 0u, 0u);
#if __CUDA_ARCH__ >= 900
    /* launched as a programmatic dependent (platform/nvrtc.py): the next product's blocks may
       start once all of this one's have, and this one reads x, the output of the kernel before
       it, only once that kernel is done (prefetching the first weights into the L2 before the
       wait measured slower) */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    load_item(wp, sp, stride_sz, xp, has_row, j < j_hi, cur, up_w, up_s);
    while (j < j_hi) {
        load_item(wp + S * 32, sp + s_step, stride_sz, xp + S * 8, has_row, j + S < j_hi, nxt,
                  up_w, up_s);
        use_item(xp, has_row, cur, acc, pairs);
        j += S, wp += S * 32, sp += s_step, xp += S * 8;
        if (j >= j_hi) break;
        load_item(wp + S * 32, sp + s_step, stride_sz, xp + S * 8, has_row, j + S < j_hi, cur,
                  up_w, up_s);
        use_item(xp, has_row, nxt, acc, pairs);
        j += S, wp += S * 32, sp += s_step, xp += S * 8;
    }
#pragma unroll
    for (int i = 0; i < 4 * (1 + GLU); i++) part[warp][i][lane] = acc[i >> 2][i & 3];
    __syncthreads();
    for (int idx = threadIdx.x; idx < 128; idx += SPLITS * S * 32) {
        const int l = idx & 31, i = idx >> 5;
        const int m = 2 * (l & 3) + (i & 1);  /* C fragment: row g + 8 (i >> 1), column m */
        if (m >= M) continue;
        float total = block_sum(part, i, l);
        u16* at = out + (size_t)m * stride_out + (T << 4) + (l >> 2) + 8 * (i >> 1);
#if GLU
        *at = silu_mul(total, block_sum(part, i + 4, l));
#else
        *at = to_bf16(total);
#endif
    }
}
"""


def variant(G: int, N: int, K: int, codebook: bool = False) -> dict:
    """Launch constants from the layer's shape alone: W = S x SPLITS warps a row tile, so that
    the grid holds about 4,096 warps (the small q/k/v, o and down products of a 7B fill a
    132-SM GPU) but at least 4 and at most 16, S <= 8 of them sharing one split of K. XPRE: x's
    fragments loaded a k-group ahead with the weights; LUT: the k-group's words (of 4) whose
    codes come from the shared table. These were best or within 1 us at every 7B layer in
    `bench/int4_gemv.py`'s sweeps (XPRE helps NF4 and slows AWQ; LUT 2 balances the ALU and the
    shared-memory pipe: docs/benchmark-log.md)."""
    want = max(4, 4096 // max(1, N // 16))
    W = min(16, 1 << (want.bit_length() - 1))  # a power of two: 4, 8 or 16
    S = min(8, W)
    return dict(S=S, SPLITS=W // S, G=G, XPRE=int(codebook), LUT=2 * int(codebook))


def source(v: dict) -> str:
    return ("".join(f"#define {k} {int(v.get(k, 0))}\n"
                    for k in ("S", "SPLITS", "G", "XPRE", "LUT", "GLU"))
            + f"#define NS {max(1, 64 // v['G'])}\n"
            + codebook_source(bool(v.get("CODEBOOK"))) + _GEMV)


@functools.cache
def _product(v: tuple, device_index: int) -> nvrtc.Kernel:
    return mma.compiled("int4_gemv", source(dict(v)), "ppppiiiiii", device_index, pdl=True)


@functools.lru_cache(maxsize=256)
def _plan(G: int, N: int, K: int, codebook: bool, device_index: int, glu: bool = False
          ) -> tuple[dict, nvrtc.Kernel]:
    """(variant, its compiled product), looked up once per shape (eager calls are host-bound)."""
    v = dict(variant(G, N, K, codebook), CODEBOOK=int(codebook), GLU=int(glu))
    return v, _product(tuple(sorted(v.items())), device_index)


def matmul(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, G: int,
           launch: dict | None = None, codebook: bool = False, glu: bool = False
           ) -> torch.Tensor:
    """x [M, K] bf16 (M <= GEMV_MAX_ROWS; up to 8 with `launch`) @ W^T -> [M, N] bf16; packed
    [N/16, K/64, 32, 4] int32; sz [K/G, N, 2] bf16 (scale, offset), or with `codebook` the NF4
    absmax [K/64, N] bf16; unit stride over n either way (a fused layer's member is a view).
    `glu`: W is a fused [gate; up] (N / 2 a multiple of 16) -> SiLU(x gate^T) * (x up^T), [M,
    N / 2]: a block takes gate's row tile T and up's beside it over the same x, so the sums are
    the plain launch's and the product rounds as kernels/fused_ops_kernel.py's silu_mul (one
    launch less a decode step, and x read once for both)."""
    M, K = x.shape
    N = packed.shape[0] * 16
    index = x.device.index or 0
    if launch is None:
        v, product = _plan(G, N, K, codebook, index, glu)
    else:
        v, product = dict(launch, CODEBOOK=int(codebook), GLU=int(glu)), None
    if glu and N % 32:
        raise ValueError(f"a fused gate/up of {N} rows has halves of whole 16-row tiles only "
                         f"when N % 32 == 0")
    scale_ok = sz.stride(1) == 1 if codebook else (sz.stride(1) == 2 and sz.stride(2) == 1)
    if (M > (8 if launch else GEMV_MAX_ROWS) or K % 64 or (64 % G and G % 64) or not scale_ok
            or v["S"] * 64 % G):  # a warp's step of S k-groups: whole groups
        raise ValueError(f"the int4 gemv kernel takes up to {GEMV_MAX_ROWS} rows of K % 64 == 0 "
                         f"and scales of unit stride over n, not {M}x{K} with scale strides "
                         f"{tuple(sz.stride())}")
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.contiguous()
    width = N // 2 if glu else N
    out = torch.empty(M, width, dtype=torch.bfloat16, device=x.device)
    (product or _product(tuple(sorted(v.items())), index))(
        grid=(width // 16, 1, 1), block=(32 * v["S"] * v["SPLITS"], 1, 1),
        args=[x, packed, sz, out, M, N, K, x.stride(0),
              sz.stride(0) if codebook else sz.stride(0) // 2, width])
    return out
