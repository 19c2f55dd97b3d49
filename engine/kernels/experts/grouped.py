"""A mixture of experts' MLP over a batch of rows, grouped by expert: each token's top-k experts
from the router, then, expert by expert, SiLU(x gate) * (x up) down over the tokens routed to it,
each scaled by its routing weight and summed per token in top-k order (a fixed order per row, so
a row's sum does not depend on the rest of the batch).

The weights are transformers 5's: gate_up [E, 2 I, H] ([gate; up] of each expert), down
[E, H, I], or the same in 4 bits (packed.py: indexing one expert dequantizes it alone). Only
the experts some token routes to are read: `plan` lists them, and both the
reference and the kernel (grouped_kernel.py) read expert e's weights only from a block of
tokens routed to e. The plan is made with device ops of fixed shapes (no host sync), so a
decode step with experts can still be captured as a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BLOCK_M = 16  # slots (token, choice) a block of the kernel's grid: one expert's


def route(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (expert ids [T, k] int64, weights [T, k] fp32): the softmax over
    all experts, its top-k, renormalised to sum to 1 where the family says (as transformers'
    routers compute them)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


@dataclass
class Plan:
    """The slots s = t k + j (token t's j-th choice) sorted by expert, cut in blocks of
    BLOCK_M slots of one expert each; a block past the last has expert -1 and reads nothing."""

    order: torch.Tensor  # [S] slots, grouped by expert (ascending), stable within one
    block_expert: torch.Tensor  # [B] int32: the block's expert, -1 for an empty block
    block_start: torch.Tensor  # [B] int32: its first position in `order`
    block_end: torch.Tensor  # [B] int32: one past the last position of its expert's slots
    top_k: int

    def experts(self) -> set[int]:
        """The experts the product reads (a host sync: for tests and notes)."""
        return {e for e in self.block_expert.tolist() if e >= 0}


def plan(ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> Plan:
    """ids [T, k] -> the plan, with at most S / block_m + min(E, S) blocks (a bound fixed by
    the shapes, as fused MoE kernels size their grid)."""
    flat = ids.reshape(-1)
    S, device = flat.numel(), flat.device
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(
        0, flat, torch.ones_like(flat))
    blocks = (counts + block_m - 1) // block_m  # [E]
    block_end_of = torch.cumsum(blocks, 0)  # blocks up to and with expert e
    slot_end = torch.cumsum(counts, 0)
    b = torch.arange(-(-S // block_m) + min(num_experts, S), device=device)
    e = torch.searchsorted(block_end_of, b, right=True)  # E past the last expert's blocks
    valid = e < num_experts
    e = e.clamp(max=num_experts - 1)
    first_block = block_end_of[e] - blocks[e]
    start = slot_end[e] - counts[e] + (b - first_block) * block_m
    return Plan(order, torch.where(valid, e, -1).to(torch.int32), start.to(torch.int32),
                slot_end[e].to(torch.int32), ids.shape[1])


def reference(x: torch.Tensor, gate_up, down, weights: torch.Tensor, p: Plan) -> torch.Tensor:
    """x [T, H] -> [T, H]: the grouped product in PyTorch, expert by expert over the plan's
    blocks (gate_up and down are indexed by expert only: a test counts the indices read)."""
    T, k = weights.shape
    out = x.new_zeros(T * k, x.shape[1])
    previous = -1
    for e, lo, hi in zip(p.block_expert.tolist(), p.block_start.tolist(),
                         p.block_end.tolist(), strict=True):
        if e < 0 or e == previous:  # an expert's blocks are consecutive: its first has them all
            continue
        previous = e
        slots = p.order[lo:hi]  # the expert's every slot: its rows in one product
        gate, up = F.linear(x[slots // k], gate_up[e]).chunk(2, dim=-1)
        out[slots] = F.linear(F.silu(gate) * up, down[e])
    return _weighted_sum(out, weights)


def _weighted_sum(out: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """out [T k, H] (slot t k + j: token t's j-th expert's output) -> [T, H], each scaled by
    its routing weight in fp32, summed in top-k order, cast back."""
    T, k = weights.shape
    scaled = out.view(T, k, -1) * weights[..., None].to(torch.promote_types(out.dtype,
                                                                           torch.float32))
    return scaled.sum(dim=1).to(out.dtype)


def product(x: torch.Tensor, gate_up, down, ids: torch.Tensor, weights: torch.Tensor,
            kernel: str = "reference") -> torch.Tensor:
    """x [T, H] routed to ids [T, k] with weights [T, k] -> [T, H], by `kernel`: "triton" (the
    grouped kernel) or "reference"; gate_up and down 16-bit tensors or packed.Packed4."""
    p = plan(ids, gate_up.shape[0])
    if kernel == "triton":
        from engine.kernels.experts import grouped_kernel

        return _weighted_sum(grouped_kernel.product(x, gate_up, down, p), weights)
    return reference(x, gate_up, down, weights, p)
