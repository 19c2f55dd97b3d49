"""The "mma" layout's dequantizing kernel (quant/int4_tile_layout.py): row tiles of a 4-bit layer
into a bf16 buffer, for the dense path of inputs longer than the int4 products take (a prefill:
quant/int4_cuda.py), in the reference's roundings; and the NF4 codebook the int4 kernels use in
place of AWQ's (q - 8) scale + offset (CODEBOOK, here and in kernels/int4_gemv_kernel.py):
W = code[q] absmax, bitsandbytes' 16 codes and its absmax per 64 weights (quant/nf4_linear.py),
rounded once to bf16. Compiled by NVRTC, launched by platform/nvrtc.py.
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import int4_mma_kernel as mma
from engine.platform import nvrtc

# bitsandbytes' NF4 code (quantiles of a normal distribution, 0 and +-1 exact): its
# functional.get_4bit_type("nf4"); quant/nf4_linear.py refuses a layer whose code differs
NF4_CODES = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
             -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
             0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
             0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)


def nf4_bf16() -> torch.Tensor:
    """The code rounded to bf16, as the kernels hold it: [16] bf16."""
    return torch.tensor(NF4_CODES, dtype=torch.float32).to(torch.bfloat16)


def codebook_source(codebook: bool) -> str:
    """The CODEBOOK switch and, when on, its table and pair lookup (CUDA, before a kernel)."""
    if not codebook:
        return "#define CODEBOOK 0\n"
    words = ", ".join(f"0x{int(b) & 0xFFFF:04X}u" for b in nf4_bf16().view(torch.int16))
    return "#define CODEBOOK 1\n#define NF4_BF16 " + words + "\n" + _CODEBOOK


_CODEBOOK = r"""
/* the 16 codes as bf16, one in each word's low half, copied to shared memory at a block's start
   (lanes index them at random: 16 words in 16 banks, no conflicts) */
__device__ __forceinline__ void load_codes(u32* tab) {
    const u32 codes[16] = {NF4_BF16};
    if (threadIdx.x < 16) tab[threadIdx.x] = codes[threadIdx.x];
    __syncthreads();
}

/* the bf16 pair (code[v & 15], code[(v >> 16) & 15]): the codebook's nibble_pair */
__device__ __forceinline__ u32 code_pair(const u32* tab, u32 v) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, 0x5410;" : "=r"(d) : "r"(tab[v & 15u]), "r"(tab[(v >> 16) & 15u]));
    return d;
}
"""

_DEQUANT = r"""
/* Row tiles [T0, T0 + tiles) to bf16 rows. AWQ: the reference's two roundings, (q - 8) scale
   rounded to bf16, then + offset rounded (Int4Linear.dequantize computes in bf16 the same way),
   sz [K/G, N, 2]; CODEBOOK: code[q] absmax rounded once, sz the absmax [K/64, N] (u16). A warp
   takes one (row tile, k-group): its 16 x 64 values go through shared memory (rows 36 words
   apart: no bank conflicts either way) and out as 16-byte pieces of whole rows. */
#define DQ_WARPS 8
extern "C" __global__ void __launch_bounds__(DQ_WARPS * 32)
int4_mma_dequant(const uint4* __restrict__ w, const u32* __restrict__ sz, uint4* __restrict__ out,
                 int T0, int tiles, int K, int G, int stride_sz) {
    __shared__ u32 tile[DQ_WARPS][16 * 36];
#if CODEBOOK
    __shared__ u32 tab[16];
    load_codes(tab);
#endif
    const int KJ = K >> 6;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int item = blockIdx.x * DQ_WARPS + warp;  /* (row tile, k-group) */
    if (item >= tiles * KJ) return;
    const int j = item % KJ, T = T0 + item / KJ;
    const int g = lane >> 2, t = lane & 3;
    const uint4 q = __ldg(w + ((size_t)T * KJ + j) * 32 + lane);
    const u32 words[4] = {q.x, q.y, q.z, q.w};
    const u32 ZERO2 = 0x80008000u;  /* bf16 (-0, -0): fma(a, b, -0) rounds a b alone */
    u32* my = tile[warp];
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const int k0 = (j << 6) + (c << 4);
#if CODEBOOK
        const u16* p = reinterpret_cast<const u16*>(sz) + (size_t)(k0 / G) * stride_sz + (T << 4)
                       + g;
#else
        const u32* p = sz + (size_t)(k0 / G) * stride_sz + (T << 4) + g;
#endif
#pragma unroll
        for (int h = 0; h < 2; h++) {  /* rows g and g + 8 */
            const u32 s = __ldg(p + 8 * h);
#if CODEBOOK
            const u32 s2 = s | (s << 16);
#else
            const u32 s2 = (s & 0xFFFFu) | (s << 16), o2 = (s >> 16) | (s & 0xFFFF0000u);
#endif
#pragma unroll
            for (int kh = 0; kh < 2; kh++) {  /* k0 + 2t and k0 + 2t + 8 */
                const u32 v = words[c] >> (4 * (h + 2 * kh));
#if CODEBOOK
                my[(g + 8 * h) * 36 + 8 * c + t + 4 * kh] = bf16x2_fma(code_pair(tab, v), s2,
                                                                        ZERO2);
#else
                const u32 prod = bf16x2_fma(bf16x2_fma(nibble_pair(v), ONE2, M136), s2, ZERO2);
                my[(g + 8 * h) * 36 + 8 * c + t + 4 * kh] = bf16x2_fma(prod, ONE2, o2);
#endif
            }
        }
    }
    __syncwarp();
    const size_t row0 = (size_t)(T - T0) << 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {  /* 16 rows x 8 pieces of 16 bytes */
        const int idx = lane + 32 * i, r = idx >> 3, piece = idx & 7;
        const u32* src = my + r * 36 + 4 * piece;
        out[((row0 + r) * K + (j << 6)) / 8 + piece] = make_uint4(src[0], src[1], src[2], src[3]);
    }
}
"""


@functools.cache
def _kernel(codebook: bool, device_index: int) -> nvrtc.Kernel:
    return mma.compiled("int4_mma_dequant", codebook_source(codebook) + _DEQUANT, "pppiiiii",
                        device_index)


def dequant(packed: torch.Tensor, sz: torch.Tensor, G: int, n0: int, rows: int,
            out: torch.Tensor, codebook: bool = False) -> torch.Tensor:
    """Rows [n0, n0 + rows) of W (multiples of 16) into out's first rows * K elements. sz: AWQ's
    [K/G, N, 2] (scale, offset), or with `codebook` the NF4 absmax [K/64, N] (G = 64)."""
    K = packed.shape[1] * 64
    dst = out.view(-1)[: rows * K]
    items = rows // 16 * (K // 64)  # (row tile, k-group) pairs, one a warp
    stride = sz.stride(0) if codebook else sz.stride(0) // 2
    _kernel(codebook, packed.device.index or 0)(
        grid=(-(-items // 8), 1, 1), block=(256, 1, 1),
        args=[packed, sz, dst, n0 // 16, rows // 16, K, G, stride])
    return dst.view(rows, K)
