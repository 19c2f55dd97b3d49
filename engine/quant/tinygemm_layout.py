"""torch's tinygemm int4 layout on CUDA (`_convert_weight_to_int4pack`), unpacked with view ops.

tinygemm is the fastest int4 kernel at decode, but at a prefill chunk's rows it is the slowest
(many times bf16's time: docs/benchmark-log.md), and torch has no op that unpacks its layout. So
prefill dequantizes the weight here (a few elementwise kernels over 4-bit codes) and multiplies
in 16 bits.

The layout, read from the packing kernel's index arithmetic: the packed tensor is
[N/8, K/(16 T), 32, T/2] int32 for T inner k-tiles; lane t = 4a + b of element [nt, ko, t, j]
holds, in nibble p = 4h + i (bits 4p..4p+3), the code of
    n = 8 nt + a,    k = 16 T ko + 32 j + 8 i + 2 b + h.
(h = 0 is the high nibble of the byte tinygemm was given: the even k.)
`pack` writes the same layout on any device, for tests where CUDA is absent; on a GPU a test
checks `unpack` against torch's own packing.
"""

from __future__ import annotations

import torch

CHUNK_CODES = 1 << 21  # codes unpacked at once: the temporaries (int32 nibbles, fp32 arithmetic)
# stay within about 12 bytes a code, 24 MiB, inside the planner's margin; the 16-bit copy itself
# is the prefill scratch the planner counts for 4-bit weights


def _order(tiles: int) -> tuple[int, int]:
    if tiles not in (2, 4, 8):
        raise ValueError(f"tinygemm packs 2, 4 or 8 inner k-tiles, not {tiles}")
    return tiles, tiles // 2


def pack(codes: torch.Tensor, tiles: int) -> torch.Tensor:
    """codes [N, K] (0..15) -> tinygemm's packed int32 [N/8, K/(16 T), 32, T/2]."""
    T, J = _order(tiles)
    N, K = codes.shape
    KO = K // (16 * T)
    c = codes.to(torch.int64).view(N // 8, 8, KO, J, 4, 4, 2)  # [nt, a, ko, j, i, b, h]
    c = c.permute(0, 2, 1, 5, 3, 6, 4)  # [nt, ko, a, b, j, h, i]
    c = c.reshape(N // 8, KO, 32, J, 8)  # lane t = 4a + b; nibble p = 4h + i
    word = (c << (4 * torch.arange(8, device=codes.device))).sum(-1)  # [NT, KO, 32, J]
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def unpack(packed: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
    """tinygemm's packed int32 [N/8, K/(16 T), 32, T/2] -> codes [N, K] uint8 (0..15); `rows`
    selects row tiles (of 8 rows) to unpack only those."""
    part = packed if rows is None else packed[rows]
    NT, KO, _, J = part.shape
    shifts = 4 * torch.arange(8, device=part.device, dtype=torch.int32)
    nib = (part[..., None] >> shifts) & 0xF  # [NT, KO, 32, J, 8]
    nib = nib.view(NT, KO, 8, 4, J, 2, 4)  # [nt, ko, a, b, j, h, i]
    codes = nib.permute(0, 2, 1, 4, 6, 3, 5)  # [nt, a, ko, j, i, b, h]
    return codes.reshape(NT * 8, KO * J * 32).to(torch.uint8)


def dequantize(packed: torch.Tensor, scales_zeros: torch.Tensor, group: int) -> torch.Tensor:
    """W [N, K] in the scales' dtype: (q - 8) scale[g, n] + offset[g, n], tinygemm's formula.
    scales_zeros [K/G, N, 2]. Unpacked about CHUNK_CODES codes at a time."""
    NT = packed.shape[0]
    N, K = NT * 8, packed.shape[1] * packed.shape[3] * 32
    out = torch.empty(N, K, dtype=scales_zeros.dtype, device=packed.device)
    step = max(1, CHUNK_CODES // (8 * K))  # row tiles a chunk
    for lo in range(0, NT, step):
        hi = min(lo + step, NT)
        codes = unpack(packed, slice(lo, hi))  # [n, K]
        n = codes.shape[0]
        sz = scales_zeros[:, lo * 8:hi * 8].transpose(0, 1).float()  # [n, K/G, 2]
        q = codes.view(n, K // group, group).float()  # fp32, then one rounding to the dtype
        out[lo * 8:hi * 8] = ((q - 8) * sz[..., :1] + sz[..., 1:]).view(n, K)
    return out


def to_nibble_order(x: torch.Tensor, tiles: int) -> torch.Tensor:
    """x [M, K] -> [M, K] with each tile's 16 T columns in the order the packed words hold their
    nibbles (a row's words for one tile, lanes 4a..4a+3, low nibble first): column
    k = 32 j + 8 i + 2 b + h goes to (b, j, h, i). kernels/int4_gemm_kernel.py reads x so."""
    M, K = x.shape
    J = _order(tiles)[1]
    return (x.view(M, K // (16 * tiles), J, 4, 4, 2)  # [m, ko, j, i, b, h]
            .permute(0, 1, 4, 2, 5, 3)  # [m, ko, b, j, h, i]
            .reshape(M, K))
