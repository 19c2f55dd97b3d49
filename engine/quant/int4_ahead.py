"""A prefill pass's 4-bit products (the "mma" layout's AWQ and NF4 layers past the kernels' row
counts) with each product's weights dequantized while the product before it multiplies: on a
side stream, into the other of two buffers.

Why: a many-row product dequantizes its layer into a buffer and multiplies it by cuBLAS
(quant/int4_cuda.py). The dequantizing is bound by memory (a 7B's 512-token prefill writes 13 GB
of bf16: about 4.3 ms on the H200) and a 512-row GEMM by the tensor cores, so in one stream their
times add (AWQ's prefill 1.35x bf16's with both replayed as graphs, BENCHMARKS.md, issue 28);
beside each other the dequantizing takes the memory bandwidth the GEMM leaves, and the attention,
norms and RoPE between products, which fill little of the GPU. Each product's bits are the
one-stream path's: the same dequantized weights, the same cuBLAS call.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from engine.kernels.int4_dequant_kernel import dequant
from engine.quant import int4_cuda
from engine.quant.int4_linear import Int4Linear
from engine.quant.nf4_linear import Nf4Linear


class Unit(NamedTuple):
    """One dequantized slice: rows n0..n0+rows-1 of a layer."""

    lin: Int4Linear
    n0: int
    rows: int


def takes(lin, rows: int) -> bool:
    """Whether a product of `rows` rows through `lin` goes through a dequantized buffer here."""
    if not isinstance(lin, Int4Linear) or lin.kernel != "mma" or not lin.packed.is_cuda:
        return False
    return int4_cuda.dense_rows(rows, _codebook(lin))


def _codebook(lin: Int4Linear) -> bool:
    return isinstance(lin, Nf4Linear)


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


class DequantAhead:
    """The products of `linears`, multiplied in this order (each once) by `linear`; their weights
    dequantized one slice ahead on a side stream (`side`: this one; benchmarks). One pass's."""

    def __init__(self, linears: list[Int4Linear], side: torch.cuda.Stream | None = None):
        self.units = [Unit(lin, n0, rows) for lin in linears
                      for n0, rows in int4_cuda.slices(lin.out_features, lin.in_features)]
        device = linears[0].packed.device
        self.bufs = int4_cuda.buffer_pair(device)
        self.main = torch.cuda.current_stream(device)
        self.side = side or _side_stream(device)
        self.ready = [torch.cuda.Event() for _ in self.units]  # unit u's weights in its buffer
        self.done = [torch.cuda.Event() for _ in self.units]  # unit u's product has read them
        self.next = 0  # the next unit to multiply
        self.issued = 0  # units whose dequantizing has been launched

    def _issue(self, u: int) -> None:
        """Launch unit u's dequantizing on the side stream, into buffer u % 2, once the product
        that read that buffer last (unit u - 2) is done."""
        if u == 0:
            self.side.wait_stream(self.main)  # the pass so far: whatever used the buffers before
        elif u >= 2:
            self.side.wait_event(self.done[u - 2])
        lin, n0, rows = self.units[u]
        with torch.cuda.stream(self.side):
            dequant(lin.packed, lin.scales_zeros, _group(lin), n0, rows, self.bufs[u % 2],
                    _codebook(lin))
            self.ready[u].record(self.side)
        self.issued = u + 1

    def linear(self, x: torch.Tensor, lin: Int4Linear) -> torch.Tensor:
        """lin(x), through the units made for it (it must be the next layer in the order)."""
        if self.next >= len(self.units) or self.units[self.next].lin is not lin:
            raise RuntimeError("products out of the order they were planned in")
        x2 = x.reshape(-1, lin.in_features).to(torch.bfloat16)  # [M, K]
        out = torch.empty(x2.shape[0], lin.out_features, dtype=torch.bfloat16, device=x2.device)
        K = lin.in_features
        while self.next < len(self.units) and self.units[self.next].lin is lin:
            u = self.next
            while self.issued < min(u + 2, len(self.units)):  # this one, and the next ahead
                self._issue(self.issued)
            self.main.wait_event(self.ready[u])
            _, n0, rows = self.units[u]
            w = self.bufs[u % 2].view(-1)[: rows * K].view(rows, K)
            torch.mm(x2, w.t(), out=out[:, n0:n0 + rows])
            self.done[u].record(self.main)
            self.next += 1
        if lin.bias is not None:
            out = out + lin.bias
        return out.view(*x.shape[:-1], lin.out_features).to(x.dtype)


def _group(lin: Int4Linear) -> int:
    return 64 if _codebook(lin) else lin.group_size


def plan(layers, rows: int) -> DequantAhead | None:
    """The products of a pass of `rows` rows over these decoder layers (their q/k/v, o, gate/up
    and down, in that order), dequantized ahead where every one of them is dequantized for cuBLAS
    and the pass is being captured as a CUDA graph (step/prefill_graphs.py): eagerly, the events
    between the streams add host work to a pass already bound by its host."""
    if not torch.cuda.is_available() or not torch.cuda.is_current_stream_capturing():
        return None
    linears = [getattr(p, f) for p in layers for f in ("qkv", "o", "gate_up", "down")]
    return DequantAhead(linears) if all(takes(lin, rows) for lin in linears) else None
