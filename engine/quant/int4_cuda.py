"""Products of the "mma" int4 layout (quant/int4_linear.py, kernels/int4_mma_kernel.py) on CUDA:
a decode step's few rows through kernels/int4_gemv_kernel.py, the tensor-core kernel up to
MMA_MAX_ROWS rows, else the layer dequantized (kernels/int4_dequant_kernel.py) a slice of output
rows at a time into one reused bf16 buffer per device, each slice multiplied by cuBLAS into its
columns; and the load check that the kernels compile and compute the reference's product.

Measured (docs/benchmark-log.md): slices small enough to stay in the L2 did
not beat the whole layer at once (the dequantizing is not where the time goes, and cuBLAS runs
best on the whole product), so a layer is one slice up to CHUNK_BYTES of bf16 weights and only
larger ones (a 7B's fused gate/up, 271 MB, in two; a 4-bit lm_head) are cut: about the one
matrix the planner counts for AWQ (plan/sizes.py, workspace_bytes). The dense result equals
F.linear(x, Int4Linear.dequantize()) up to cuBLAS's own order (the same weight bits).
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import int4_gemv_kernel as gemv
from engine.kernels import int4_mma_kernel as mod
from engine.kernels.int4_dequant_kernel import dequant
from engine.platform.device_timing import event_times_ms

CHUNK_BYTES = 160 << 20  # the most bf16 weights dequantized at once
_buffers: dict[torch.device, torch.Tensor] = {}


def reserve(device: torch.device, N: int, K: int) -> torch.Tensor | None:
    """The device's slice buffer, large enough for the slices of an N x K layer: made at load
    (and grown for a larger layer), so a CUDA graph captured later never allocates it. None off
    CUDA (a layer built on the CPU only to be read back there)."""
    if device.type != "cuda":
        return None
    key = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
    need = max(16 * K, min(N * K, _step(N, K) * K))
    buf = _buffers.get(key)
    if buf is None or buf.numel() < need:
        buf = _buffers[key] = torch.empty(need, dtype=torch.bfloat16, device=device)
    return buf


def _step(N: int, K: int) -> int:
    """Rows a slice: whole row tiles of 16, at most CHUNK_BYTES of bf16."""
    return min(N, max(16, (CHUNK_BYTES // 2 // K) // 16 * 16))


def matmul(x2: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, G: int,
           codebook: bool = False) -> torch.Tensor:
    """x2 [M, K] bf16 @ W^T -> [M, N] bf16; past MMA_MAX_ROWS rows (NF4's codebook: past the
    gemv's) through dequantized slices."""
    if x2.shape[0] == 0:  # no launch of an empty grid
        return x2.new_empty(0, sz.shape[1])
    if x2.shape[0] <= gemv.GEMV_MAX_ROWS:
        return gemv.matmul(x2, packed, sz, G, codebook=codebook)
    if x2.shape[0] <= mod.MMA_MAX_ROWS and not codebook:
        return mod.matmul(x2, packed, sz, G)
    M, K = x2.shape
    N = sz.shape[1]
    buf = reserve(x2.device, N, K)
    step = _step(N, K)
    if step >= N:  # one slice: no output to cut (an eager prefill is bound by its host work)
        return torch.mm(x2, dequant(packed, sz, G, 0, N, buf, codebook).t())
    out = torch.empty(M, N, dtype=torch.bfloat16, device=x2.device)
    for n0 in range(0, N, step):
        rows = min(step, N - n0)
        w = dequant(packed, sz, G, n0, rows, buf, codebook)  # [rows, K]
        torch.mm(x2, w.t(), out=out[:, n0:n0 + rows])  # cuBLAS writes the columns in place
    return out


def layer_glu(lin: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """Int4Linear.silu_glu of a layer that took the launch (glu_wanted): x [..., K] -> SiLU(gate)
    * up [..., N / 2] in one launch of the gemv (kernels/int4_gemv_kernel.py, glu), or None past
    the gemv's rows (the caller multiplies, then applies silu_mul)."""
    x2 = x.reshape(-1, lin.in_features).to(torch.bfloat16)
    if not 0 < x2.shape[0] <= gemv.GEMV_MAX_ROWS:
        return None
    out = gemv.matmul(x2, lin.packed, lin.scales_zeros, lin.group_size, codebook=lin.codebook,
                      glu=True)
    return out.view(*x.shape[:-1], -1).to(x.dtype)


def glu_wanted(lin: torch.nn.Module) -> bool:
    """Whether a fused [gate; up] int4 layer takes silu_glu's launch: "mma" on CUDA, no bias,
    halves of whole row tiles, and the launch checked and timed faster here (at load, before
    any graph capture)."""
    N, K = lin.out_features, lin.in_features
    return (lin.kernel == "mma" and lin.packed.device.type == "cuda" and lin.bias is None
            and N % 32 == 0
            and glu_faster(N, K, lin.group_size, lin.codebook, str(lin.packed.device)))


@functools.lru_cache(maxsize=64)
def glu_faster(N: int, K: int, G: int, codebook: bool, device: str) -> bool:
    """Whether the gemv's SiLU * up launch beats the plain launch and silu_mul for one row of a
    fused gate/up of this shape here, timed at load on random codes (CUDA-graph replays, best of
    5 each; the same bits either way, so only speed decides): it was faster at the Qwen2.5-7B's
    gate/up and slower at the Llama-3.1-8B's (more registers, fewer blocks)."""
    if not glu_ok(device):
        return False
    try:
        return _glu_timed(N, K, G, codebook, device)
    except Exception:  # noqa: BLE001 - a capture or launch that failed: the plain launches
        return False


def _glu_timed(N: int, K: int, G: int, codebook: bool, device: str) -> bool:
    from engine.kernels import fused_ops_kernel

    g = torch.Generator().manual_seed(0)
    packed = torch.randint(-2**31, 2**31 - 1, (N // 16, K // 64, 32, 4), generator=g,
                           dtype=torch.int32).to(device)
    sz = (torch.rand((K // G, N) if codebook else (K // G, N, 2), generator=g) * 0.01).to(
        device, torch.bfloat16)
    x = torch.randn(1, K, generator=g).to(device, torch.bfloat16)
    best = []
    for glu in (False, True):
        def run(glu=glu):
            for _ in range(8):
                out = gemv.matmul(x, packed, sz, G, codebook=codebook, glu=glu)
                if not glu:
                    out = fused_ops_kernel.silu_mul(out)
        best.append(min(event_times_ms(run, 5, graphed=True)))
    return best[1] < best[0]


@functools.cache
def glu_ok(device: str) -> bool:
    """Whether the gemv's SiLU * up launch gives silu_mul of the plain launch's product, bit for
    bit, on a small random fused layer at each row count it takes (AWQ and NF4): once per device,
    else the step multiplies and applies silu_mul apart."""
    from engine.kernels import fused_ops_kernel
    from engine.quant.int4_linear import Int4Linear, random_codes

    if not device.startswith("cuda"):
        return False
    g = torch.Generator().manual_seed(0)
    N, K, G = 192, 512, 64
    codes, zeros, scales = random_codes(N, K, G, g)
    try:
        lin = Int4Linear.from_codes(codes, zeros, scales, None, torch.bfloat16,
                                    torch.device(device), kernel="mma", check=False)
        for codebook in (False, True):
            sz = lin.scales_zeros if not codebook else lin.scales_zeros[..., 0].contiguous()
            for rows in range(1, gemv.GEMV_MAX_ROWS + 1):
                x = torch.randn(rows, K, generator=g).to(device, torch.bfloat16)
                plain = gemv.matmul(x, lin.packed, sz, G, codebook=codebook)
                fused = gemv.matmul(x, lin.packed, sz, G, codebook=codebook, glu=True)
                if not torch.equal(fused, fused_ops_kernel.silu_mul(plain)):
                    return False
        return True
    except Exception:  # noqa: BLE001 - no NVRTC, Triton or a failed launch: the plain pieces
        return False


def matches_reference(lin: torch.nn.Module, row_counts: tuple[int, ...],
                      g: torch.Generator) -> bool:
    """Whether a load check's small layer gives its dequantized weights' product (within bf16
    rounding) at each of `row_counts` rows of random x."""
    w = lin.dequantize().float()
    for rows in row_counts:
        x = torch.randn(rows, lin.in_features, generator=g).to(w.device, torch.bfloat16)
        ref = x.float() @ w.t()
        if not ((lin(x).float() - ref).norm() / ref.norm()).item() < 1e-2:
            return False
    return True


@functools.cache
def kernel_ok(device: str) -> bool:
    """Whether the mma kernels compile here (NVRTC) and give the dequantized reference's product
    at every row count they take and through the dense path: checked once on a small random
    layer, else choose_kernel passes over them."""
    from engine.quant.int4_linear import Int4Linear, random_codes

    if not device.startswith("cuda"):
        return False
    g = torch.Generator().manual_seed(0)
    N, K, G = 208, 512, 64  # N not a multiple of a block's rows
    codes, zeros, scales = random_codes(N, K, G, g)
    try:
        lin = Int4Linear.from_codes(codes, zeros, scales, None, torch.bfloat16,
                                    torch.device(device), kernel="mma", check=False)
        return matches_reference(lin, (1, 3, 4, 5, 9, 17, 64, 65), g)
    except Exception:  # noqa: BLE001 - no NVRTC, a failed compile or launch: other kernels
        return False
