"""The engine's 4-bit linear layer (AWQ weights, and a 4-bit lm_head): packed codes with a scale
and an offset per group of input features, in the layout of the kernel that runs it.

One formula for every kernel, tinygemm's: W[n, k] = (q[n, k] - 8) * scale[g, n] + offset[g, n]
with g = k // group_size, so AWQ's zero point z becomes offset = (8 - z) * scale. Kernels:
- "tinygemm": torch's `_weight_int4pack_mm` (CUDA, bf16; gpt-fast's and torchao's int4 path);
  above TINYGEMM_MAX_ROWS rows (prefill) its layout goes through a Triton GEMM that dequantizes
  tiles in registers (kernels/int4_gemm_kernel.py), else is unpacked (quant/tinygemm_layout.py)
  and multiplied in 16 bits, each where it checks out on the device (HEARTH_INT4_PREFILL);
- "mma":      CUDA C++ through NVRTC, bf16, over quant/int4_tile_layout.py: a decode step's 1-4
  rows through kernels/int4_gemv_kernel.py, up to 64 through kernels/int4_mma_kernel.py (both
  the tensor cores' product with the weights dequantized in registers); more rows dequantize the
  layer into a reused buffer for cuBLAS (quant/int4_cuda.py); quant/nf4_linear.py's NF4 too;
- "triton":   kernels/int4_kernel.py, a split-K GEMV written for this project (CUDA, fp16 or bf16);
- "cpu":      torch's `_weight_int4pack_mm_for_cpu`;
- "reference": dequantize, then a plain matmul: the oracle the others are tested against.
The layout is fixed at load (gpt-fast's habit), so forward sees one layout; every kernel is
CUDA-graph capturable (static shapes, no host sync).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from engine.config.backends import INT4_KERNELS as KERNELS
from engine.quant import int4_cuda, int4_tile_layout

CUDA_DEFAULT = "mma"  # as fast as tinygemm at one row and about twice its aggregate at 16
# concurrent; tinygemm where its shapes do not fit or NVRTC is
# missing, then the Triton GEMV
QUANTIZE_ROWS = 8192  # rows rounded at once: a 150K-vocabulary lm_head never sits in fp32 whole
TRITON_MAX_ROWS = 16  # the Triton GEMV is written for decode; prefill dequantizes instead
TINYGEMM_MAX_ROWS = 64  # above this, tinygemm's layout goes through the Triton GEMM that
# dequantizes tiles in registers (kernels/int4_gemm_kernel.py), else unpacked to 16 bits for a
# dense matmul (tinygemm's time grows with every row); not timed on a GPU (int4_gemm.py's sweep)


@functools.cache
def tinygemm_unpack_ok(device: str) -> bool:
    """Whether tinygemm_layout.unpack reads torch's packing on this device: checked once on a
    small random layer, so a torch whose layout differs keeps tinygemm for every row count."""
    from engine.quant import tinygemm_layout

    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (16, 256), generator=g, dtype=torch.uint8)
    try:
        codes = codes.to(device)
        pairs = (codes[:, ::2] << 4) | codes[:, 1::2]
        packed = torch.ops.aten._convert_weight_to_int4pack(pairs.contiguous(),
                                                            _tinygemm_tiles(256))
        return bool(torch.equal(tinygemm_layout.unpack(packed), codes))
    except RuntimeError:  # no such packing here: tinygemm (or the identity product) it is
        return False


def random_codes(N: int, K: int, G: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """A small random layer for the load checks: codes [N, K], zeros and scales [K/G, N]."""
    codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    zeros = torch.randint(0, 16, (K // G, N), generator=g).float()
    return codes, zeros, torch.rand(K // G, N, generator=g) / 16 + 1e-3


@functools.cache
def tinygemm_gemm_ok(device: str) -> bool:
    """Whether the Triton GEMM over tinygemm's layout compiles and gives the dequantized
    reference's product on this device: checked once on a small random layer, else the
    unpacking path (or tinygemm itself) takes every row count."""
    from engine.kernels.attention_backend import triton_available

    if not device.startswith("cuda") or not triton_available():
        return False
    g = torch.Generator().manual_seed(0)
    N, K, G = 256, 512, 128
    codes, zeros, scales = random_codes(N, K, G, g)
    x = torch.randn(80, K, generator=g).to(device, torch.bfloat16)
    try:
        lin = Int4Linear.from_codes(codes, zeros, scales, None, torch.bfloat16,
                                    torch.device(device), kernel="tinygemm")
        out = fused_matmul(x, lin.packed, lin.scales_zeros, G).float()
        ref = x.float() @ lin.dequantize().float().t()
        return bool(((out - ref).norm() / ref.norm()).item() < 1e-2)
    except Exception:  # noqa: BLE001 - any failure to compile or run: the other paths
        return False


def fused_matmul(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                 G: int, config: dict | None = None) -> torch.Tensor:
    """x [M, K] @ W^T through the Triton GEMM over tinygemm's layout `packed`
    [N/8, K/(16 T), 32, T/2]: x's columns put in the packed nibbles' order, then the kernel."""
    from engine.kernels.int4_gemm_kernel import tinygemm_matmul
    from engine.quant.tinygemm_layout import to_nibble_order

    return tinygemm_matmul(to_nibble_order(x, 2 * packed.shape[3]), packed, scales_zeros, G,
                           config)


def _tinygemm_tiles(K: int) -> int | None:
    """tinygemm's inner_k_tiles: K must be a multiple of 16 of them (8 is gpt-fast's choice)."""
    return next((t for t in (8, 4, 2) if K % (16 * t) == 0), None)


def kernel_fits(kernel: str, device: torch.device, dtype: torch.dtype, N: int, K: int,
                group_size: int) -> bool:
    """Whether `kernel` runs these shapes in this dtype on this device."""
    if kernel == "reference":
        return True
    if kernel == "cpu":
        return (device.type == "cpu" and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
                and N % 16 == 0 and K % 2 == 0)
    if device.type != "cuda":
        return False
    if kernel == "tinygemm":
        return (dtype == torch.bfloat16 and torch.cuda.get_device_capability(device) >= (8, 0)
                and N % 8 == 0 and _tinygemm_tiles(K) is not None
                and group_size in (32, 64, 128, 256))
    if kernel == "mma":
        return (dtype == torch.bfloat16  # a group within one k-group of 64, or whole ones
                and (group_size in (16, 32, 64) or group_size % 64 == 0)
                and int4_tile_layout.fits(N, K) and int4_cuda.kernel_ok(str(device)))
    if kernel == "triton":
        from engine.kernels.attention_backend import triton_available

        return dtype in (torch.float16, torch.bfloat16) and K % 8 == 0 and triton_available()
    raise ValueError(f"unknown int4 kernel {kernel!r}; choose one of {', '.join(KERNELS)}")


def choose_kernel(device: torch.device, dtype: torch.dtype, N: int, K: int,
                  group_size: int, forced: str | None = None) -> str:
    """`forced` (a session's Backends.int4_kernel) where it fits these shapes; else the fastest
    that does."""
    if forced and forced not in KERNELS:
        raise ValueError(f"int4 kernel {forced!r}; choose one of {', '.join(KERNELS)}")
    order = ([forced] if forced else []) + (
        [CUDA_DEFAULT, "tinygemm", "triton"] if device.type == "cuda" else ["cpu"])
    return next((k for k in order if kernel_fits(k, device, dtype, N, K, group_size)),
                "reference")


def pack_rows(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] (0..15) -> [N, K/8] int32, k = 8 w + j in bits 4j..4j+3 of word w: each output
    row on its own (so rows concatenate), read as bytes by `unpack_rows`."""
    N, K = codes.shape
    c = codes.to(torch.int64).view(N, K // 8, 8)
    words = (c << torch.arange(0, 32, 4, device=codes.device)).sum(-1)  # [N, K/8] < 2^32
    return (words - ((words >> 31) << 32)).to(torch.int32)


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """[N, K/8] int32 -> codes [N, K] uint8 (little-endian bytes: codes 2b, 2b+1 in byte b)."""
    b = packed.contiguous().view(torch.uint8)  # [N, K/2]
    return torch.stack((b & 0xF, b >> 4), dim=-1).view(packed.shape[0], -1)


class Int4Linear(torch.nn.Module):
    """y = x W^T + bias with W as above. packed: the kernel's layout of the codes; scales_zeros:
    [K/G, N, 2] (scale, offset) in the compute dtype; bias: [N] or None."""

    codebook = False  # NF4's codes (quant/nf4_linear.py) index a table instead
    glu = False  # silu_glu's launch: where a fused gate/up measured it faster (choose_glu)

    def __init__(self, in_features: int, out_features: int, group_size: int, kernel: str,
                 packed: torch.Tensor, scales_zeros: torch.Tensor,
                 bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.group_size, self.kernel = group_size, kernel
        self.fused_prefill = True  # Backends.int4_prefill "unpack": the loader sets it False
        self.gemm_rows = TINYGEMM_MAX_ROWS + 1  # rows from which the Triton GEMM takes the
        # product; quant/int4_rows.py measures it at load for the batched step's row counts
        # Parameters (frozen), not buffers: memory footprints and benchmarks count them as weights
        self.packed = torch.nn.Parameter(packed, requires_grad=False)
        self.scales_zeros = torch.nn.Parameter(scales_zeros, requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, kernel={self.kernel}")

    @classmethod
    def from_codes(cls, codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                   bias: torch.Tensor | None, dtype: torch.dtype, device: torch.device,
                   kernel: str | None = None, forced: str | None = None,
                   check: bool = True) -> Int4Linear:
        """codes [N, K] (0..15), zeros [K/G, N] (AWQ's zero points), scales [K/G, N].
        `kernel`: this one or fail; else choose_kernel's pick (`forced` where it fits).
        check=False skips kernel_fits (the kernel's own load check builds a layer)."""
        N, K = codes.shape
        G = K // scales.shape[0]
        kernel = kernel or choose_kernel(device, dtype, N, K, G, forced)
        if check and not kernel_fits(kernel, device, dtype, N, K, G):
            raise ValueError(f"the {kernel} int4 kernel cannot run a {K}x{N} {dtype} layer on "
                             f"{device}")
        codes = codes.to(device)
        s = scales.to(device, torch.float32)
        offsets = (8 - zeros.to(device, torch.float32)) * s
        sz = torch.stack((s, offsets), dim=-1).to(dtype).contiguous()  # [K/G, N, 2]
        if kernel == "tinygemm":  # [N, K/2] uint8, even k in the high nibble -> tinygemm tiles
            pairs = (codes[:, ::2].to(torch.uint8) << 4) | codes[:, 1::2].to(torch.uint8)
            packed = torch.ops.aten._convert_weight_to_int4pack(pairs.contiguous(),
                                                                _tinygemm_tiles(K))
        elif kernel == "cpu":
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                codes.to(torch.int32).contiguous(), 1)
        elif kernel == "mma":
            packed = int4_tile_layout.pack(codes)
            int4_cuda.reserve(device, N, K)  # the dense path's buffer, before any graph capture
        else:
            packed = pack_rows(codes)
        if bias is not None:
            bias = bias.to(device, dtype)
        return cls(K, N, G, kernel, packed, sz, bias)

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None, group_size: int,
                 dtype: torch.dtype, device: torch.device, kernel: str | None = None
                 ) -> Int4Linear:
        """Round-to-nearest 4-bit of a 16/32-bit weight [N, K] (a 4-bit lm_head, random
        benchmark weights); AWQ checkpoints come through from_codes instead."""
        from engine.quant import awq_format

        parts = [awq_format.quantize(weight[lo:lo + QUANTIZE_ROWS].to(device), group_size)
                 for lo in range(0, weight.shape[0], QUANTIZE_ROWS)]  # fp32 a chunk at a time
        codes = torch.cat([c for c, _, _ in parts])
        zeros, scales = (torch.cat([p[i] for p in parts], dim=1) for i in (1, 2))
        return cls.from_codes(codes, zeros, scales, bias, dtype, device, kernel)

    def dequantize(self) -> torch.Tensor:
        """W [N, K] in the compute dtype: what nn.Linear's weight would hold."""
        sz = self.scales_zeros
        if self.kernel == "tinygemm" and tinygemm_unpack_ok(str(sz.device)):
            from engine.quant import tinygemm_layout

            return tinygemm_layout.dequantize(self.packed, sz, self.group_size)
        if self.kernel in ("tinygemm", "cpu"):  # no unpacking op: multiply the identity
            eye = torch.eye(self.in_features, dtype=sz.dtype, device=sz.device)
            return self._packed_mm(eye, sz.contiguous()).t()
        G = self.group_size
        if self.kernel == "mma":
            codes = int4_tile_layout.unpack(self.packed).view(self.out_features, -1, G)
        else:
            codes = unpack_rows(self.packed).view(self.out_features, -1, G)  # [N, K/G, G]
        s, off = sz[..., 0].t()[..., None], sz[..., 1].t()[..., None]  # [N, K/G, 1]
        return ((codes.to(sz.dtype) - 8) * s + off).view(self.out_features, self.in_features)

    def _dense(self, rows: int) -> bool:
        """Whether dequantizing once and a dense matmul beat the kernel for `rows` rows."""
        if self.kernel == "triton":
            return rows > TRITON_MAX_ROWS
        if self.kernel == "cpu":  # its dequantize is itself a K-row product: past K rows,
            return rows > self.in_features  # dequantize + matmul is cheaper
        if self.kernel == "tinygemm":
            return rows > TINYGEMM_MAX_ROWS and tinygemm_unpack_ok(str(self.packed.device)) \
                and not self._fused_gemm(rows)
        return self.kernel == "reference"

    def _fused_gemm(self, rows: int) -> bool:
        """Whether the Triton GEMM over tinygemm's layout takes these rows."""
        return (self.kernel == "tinygemm" and rows >= self.gemm_rows and self.fused_prefill
                and tinygemm_gemm_ok(str(self.packed.device)))

    def _packed_mm(self, x2: torch.Tensor, sz: torch.Tensor) -> torch.Tensor:
        if self.kernel == "tinygemm":
            return torch.ops.aten._weight_int4pack_mm(x2, self.packed, self.group_size, sz)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.group_size, sz)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.scales_zeros.dtype
        x2 = x.reshape(-1, self.in_features).to(dtype)  # [M, K]
        if self.kernel == "mma":  # first: an eager prefill is bound by its host work
            out = int4_cuda.matmul(x2, self.packed, self.scales_zeros, self.group_size)
        elif self._fused_gemm(x2.shape[0]):
            out = fused_matmul(x2, self.packed, self.scales_zeros, self.group_size)
        elif self._dense(x2.shape[0]):
            out = F.linear(x2, self.dequantize())
        elif self.kernel == "triton":
            from engine.kernels import int4_kernel

            out = int4_kernel.int4_matmul(x2, self.packed, self.scales_zeros, self.group_size)
        else:  # a fused q/k/v member holds a view of the fused scales: the kernels want them dense
            out = self._packed_mm(x2.contiguous(), self.scales_zeros.contiguous())
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def silu_glu(self, x: torch.Tensor) -> torch.Tensor | None:
        """A fused [gate; up]'s SiLU(gate) * up in one launch where faster (glu) -> [..., N/2]."""
        return int4_cuda.layer_glu(self, x) if self.glu else None

    @staticmethod
    def concat(mods: list[Int4Linear]) -> Int4Linear | None:
        """One layer computing [m(x) for m in mods] concatenated (q/k/v, gate/up), sharing their
        memory (the members' tensors become views of the fused ones); None where the rows do not
        concatenate (the CPU kernel packs 64 rows together)."""
        first = mods[0]
        if first.kernel == "cpu" or any(
                (type(m), m.kernel, m.in_features, m.group_size, m.scales_zeros.dtype)
                != (type(first), first.kernel, first.in_features, first.group_size,
                    first.scales_zeros.dtype)
                for m in mods):
            return None
        if any(m.bias is not None for m in mods) and not all(m.bias is not None for m in mods):
            return None
        # tinygemm packs rows in tiles of 8 along dim 0 (out_features % 8 == 0); ours by row
        packed = torch.cat([m.packed.data for m in mods])
        sz = torch.cat([m.scales_zeros.data for m in mods], dim=1)  # [K/G, sum N, 2]
        bias = None if first.bias is None else torch.cat([m.bias.data for m in mods])
        rows, cols = 0, 0
        for m in mods:
            n = m.packed.shape[0]
            m.packed.data = packed[rows: rows + n]
            m.scales_zeros.data = sz[:, cols: cols + m.out_features]
            if bias is not None:
                m.bias.data = bias[cols: cols + m.out_features]
            rows, cols = rows + n, cols + m.out_features
        if first.kernel == "mma":  # the fused layer's slices, before any graph capture
            int4_cuda.reserve(packed.device, cols, first.in_features)
        return type(first)(first.in_features, cols, first.group_size, first.kernel, packed, sz,
                          bias)

    def choose_glu(self) -> None:
        """As a fused [gate; up], at load: silu_glu's launch where it checks out and is faster."""
        self.glu = int4_cuda.glu_wanted(self)
