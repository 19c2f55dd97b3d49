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


def code_tables() -> list[int]:
    """The code's bf16 low bytes, then high bytes, four codes a word (code 4i in the low byte of
    word i): the eight words code_word permutes bytes out of."""
    halves = [int(b) & 0xFFFF for b in nf4_bf16().view(torch.int16)]
    return [sum(((halves[4 * i + k] >> shift) & 0xFF) << 8 * k for k in range(4))
            for shift in (0, 8) for i in range(4)]


def codebook_source(codebook: bool) -> str:
    """The CODEBOOK switch and, when on, its tables and lookup (CUDA, before a kernel)."""
    if not codebook:
        return "#define CODEBOOK 0\n"
    words = code_tables()
    return ("#define CODEBOOK 1\n" + "".join(
        f"#define {'LH'[i // 4]}{i % 4} 0x{w:08X}u\n" for i, w in enumerate(words)) + _CODEBOOK)


_CODEBOOK = r"""
/* Four codes' bytes of one kind (T0..T3: L or H) for the selector nibbles of s (bit 3 cleared)
   and m (4 where the code's bit 3 is set): prmt picks among 8 bytes, so codes 0-7 and 8-15 are
   looked up apart and m takes one or the other */
#define CODE_BYTES(T0, T1, T2, T3, s, m) \
    __byte_perm(__byte_perm(T0, T1, s), __byte_perm(T2, T3, s), m)

/* A word's four A registers in the codebook order (quant/int4_tile_layout.py): register i is the
   bf16 pair (code of nibble 2i, code of nibble 2i + 1); no shared memory, no table in memory */
__device__ __forceinline__ void code_word(u32 v, u32 (&a)[4]) {
    const u32 s = v & 0x77777777u, m = ((v >> 1) & 0x44444444u) | 0x32103210u;
    const u32 sh = s >> 16, mh = m >> 16;
    const u32 l = CODE_BYTES(L0, L1, L2, L3, s, m), h = CODE_BYTES(H0, H1, H2, H3, s, m);
    const u32 lh = CODE_BYTES(L0, L1, L2, L3, sh, mh), hh = CODE_BYTES(H0, H1, H2, H3, sh, mh);
    a[0] = __byte_perm(l, h, 0x5140);
    a[1] = __byte_perm(l, h, 0x7362);
    a[2] = __byte_perm(lh, hh, 0x5140);
    a[3] = __byte_perm(lh, hh, 0x7362);
}
"""

_DEQUANT = r"""
/* Row tiles [T0, T0 + tiles) to bf16 rows. AWQ: the reference's two roundings, (q - 8) scale
   rounded to bf16, then + offset rounded (Int4Linear.dequantize computes in bf16 the same way),
   sz [K/G, N, 2]; CODEBOOK: code[q] absmax rounded once, sz the absmax [K/64, N] (u16). A warp
   takes one (row tile, k-group): a lane's words hold 16 bytes of each of its rows g and g + 8 in
   each half of the 64 k (the layout's k order), stored as they are (a row's 64 bytes a warp
   store: whole sectors). */
#define DQ_WARPS 8
extern "C" __global__ void __launch_bounds__(DQ_WARPS * 32)
int4_mma_dequant(const uint4* __restrict__ w, const u32* __restrict__ sz, uint4* __restrict__ out,
                 int T0, int tiles, int K, int G, int stride_sz) {
    const int KJ = K >> 6;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int item = blockIdx.x * DQ_WARPS + warp;  /* (row tile, k-group) */
    if (item >= tiles * KJ) return;
    const int j = item % KJ, T = T0 + item / KJ;
    const int g = lane >> 2, t = lane & 3;
    const uint4 q = __ldg(w + ((size_t)T * KJ + j) * 32 + lane);
    const u32 words[4] = {q.x, q.y, q.z, q.w};
    const u32 ZERO2 = 0x80008000u;  /* bf16 (-0, -0): fma(a, b, -0) rounds a b alone */
#pragma unroll
    for (int h = 0; h < 2; h++) {  /* rows g and g + 8 */
#pragma unroll
        for (int c1 = 0; c1 < 2; c1++) {  /* k 64 j + 32 c1 + 8 t, + 8: words 2 c1 and 2 c1 + 1 */
            u32 o[4];
#pragma unroll
            for (int c0 = 0; c0 < 2; c0++) {
                const int c = 2 * c1 + c0, grp = ((j << 6) + (c << 4)) / G;
#if CODEBOOK
                const u32 s = __ldg(reinterpret_cast<const u16*>(sz) + (size_t)grp * stride_sz
                                    + (T << 4) + g + 8 * h);
                const u32 s2 = s | (s << 16);
#else
                const u32 s = __ldg(sz + (size_t)grp * stride_sz + (T << 4) + g + 8 * h);
                const u32 s2 = (s & 0xFFFFu) | (s << 16), o2 = (s >> 16) | (s & 0xFFFF0000u);
#endif
#pragma unroll
                for (int kh = 0; kh < 2; kh++) {  /* the pairs at 4 c0 + 2 kh of the 8 */
#if CODEBOOK
                    u32 a[4];
                    code_word(words[c], a);
                    o[2 * c0 + kh] = bf16x2_fma(a[h + 2 * kh], s2, ZERO2);
#else
                    const u32 v = words[c] >> (4 * (h + 2 * kh));
                    const u32 prod = bf16x2_fma(bf16x2_fma(nibble_pair(v), ONE2, M136), s2,
                                                ZERO2);
                    o[2 * c0 + kh] = bf16x2_fma(prod, ONE2, o2);
#endif
                }
            }
            const size_t row = ((size_t)(T - T0) << 4) + g + 8 * h;
            out[(row * K + (j << 6) + 32 * c1 + 8 * t) / 8] = make_uint4(o[0], o[1], o[2], o[3]);
        }
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
