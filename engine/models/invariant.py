"""The reproducible mode's pieces of the family step: each token's logits get the same bits
however the pass that computed them was cut (a prefill chunk of 1 or 512 tokens, a verify
block, a decode step, a warm or a cold cache), so a greedy answer does not change with how it
was computed ("Defeating Nondeterminism in LLM Inference", Thinking Machines, 2025).

What varies with the number of rows in a pass, and what the mode does about it:
- matrix products: BLAS libraries pick a kernel, and with it a summation order, by the row
  count (docs/benchmark-log.md, "Reproducible greedy", says which counts kept a row's bits where).
  At load, `calibrate` finds for each linear the largest tile of rows, at most MAX_TILE, whose
  every size gives each row the bits of that row alone (under 1 thread and the session's
  count), and the mode runs products in tiles of that size (1 where none matches), a tile of
  one row as two (`paired`: the matrix-vector kernel is never used);
- attention: each row runs exactly the decode step's attention call (its own KV bucket, its
  own mask), alone on the CPU kernels, and in the Triton kernel grouped by bucket in runs no
  longer than a verify block, whose rows get the bits of single steps;
- RoPE: its tables come from one table over every position, not from each pass's positions.
Norms, SiLU and residual adds work row by row already (tests/engine/models/test_invariant.py
holds every piece to the property).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

MAX_TILE = 16  # rows: the probe's size; bf16 products on the CPU and GPUs measured keep 16


@dataclass
class RowTiles:
    """Per linear kind ("qkv", "o", "gate_up", "down", "lm_head"): the rows a product may take
    at once and still give each row its own bits."""

    rows: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.rows.items())


def tiled(x: torch.Tensor, product: Callable[[torch.Tensor], torch.Tensor], rows: int
          ) -> torch.Tensor:
    """x: [1, T, in] -> product(x), computed `rows` rows at a time: [1, T, out]."""
    T = x.shape[1]
    if T <= rows:
        return product(x)
    return torch.cat([product(x[:, i:i + rows]) for i in range(0, T, rows)], dim=1)


def paired(product: Callable[[torch.Tensor], torch.Tensor]
           ) -> Callable[[torch.Tensor], torch.Tensor]:
    """`product` with a pass of one row run as two (the row twice, the first kept): BLAS
    libraries take a matrix-vector kernel for one row, whose bits can differ from their matrix
    kernel's on some inputs only (SmolLM2's down_proj on this CPU: random rows agreed, real
    activations in a batch of 4 did not); from two rows on, one kernel serves every count."""
    def run(x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != 1:
            return product(x)
        return product(torch.cat([x, x], dim=1))[:, :1]  # [1, 2, in] -> [1, 1, out]
    return run


def largest_tile(product: Callable[[torch.Tensor], torch.Tensor], in_features: int,
                 dtype: torch.dtype, device: torch.device,
                 thread_counts: tuple[int, ...] = ()) -> int:
    """The largest tile of 1, 2, 4, 8, MAX_TILE rows for which every size from 1 up gives each
    of its rows the bits of that row alone, under each of `thread_counts` (CPU); 0 where even
    one row alone does not repeat its bits."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, MAX_TILE, in_features, generator=g).to(device, dtype)
    threads = torch.get_num_threads()
    alone = torch.cat([product(x[:, i:i + 1]) for i in range(MAX_TILE)], dim=1)

    def holds(size: int, n: int) -> bool:
        if device.type == "cpu":
            torch.set_num_threads(n)
        if size == 1:
            return torch.equal(torch.cat([product(x[:, i:i + 1]) for i in range(MAX_TILE)],
                                         dim=1), alone)
        return all(torch.equal(product(x[:, i:i + size]), alone[:, i:i + size])
                   for i in range(0, MAX_TILE - size + 1, size))

    try:
        counts = thread_counts or (threads,)
        best, checked = 1, 0
        for tile in (1, 2, 4, 8, MAX_TILE):
            if not all(holds(size, n) for n in counts for size in range(checked + 1, tile + 1)):
                return 0 if tile == 1 else best  # 0: not even one row alone repeats its bits
            best, checked = tile, tile
        return best
    finally:
        if device.type == "cpu":
            torch.set_num_threads(threads)


class RopeTable:
    """cos and sin for every position below `context` ([context, D] each, in `dtype`), made
    once as FamilyStep.cos_sin makes them: a pass reads its rows, whatever its length."""

    def __init__(self, cos_sin: Callable, context: int, device: torch.device,
                 dtype: torch.dtype):
        self.cos, self.sin = cos_sin(torch.arange(context, device=device), dtype)

    def __call__(self, pos: torch.Tensor, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[pos].to(dtype), self.sin[pos].to(dtype)


def row_buckets(first: int, T: int, bucket: Callable[[int], int], most: int
                ) -> list[tuple[int, int, int]]:
    """Rows first..first+T-1 as runs (lo, hi, kv_len) of at most `most` rows whose decode step
    reads the same KV bucket (kv_len = bucket(position + 1))."""
    runs: list[tuple[int, int, int]] = []
    for t in range(T):
        L = bucket(first + t + 1)
        if runs and runs[-1][2] == L and t - runs[-1][0] < most:
            runs[-1] = (runs[-1][0], t + 1, L)
        else:
            runs.append((t, t + 1, L))
    return runs


def calibrate(step, linear: Callable, thread_counts: tuple[int, ...] = ()) -> RowTiles | None:
    """RowTiles for a FamilyStep: each linear kind of its first layer and its lm_head probed
    with largest_tile (the kernels are chosen by shapes, which every layer shares). `linear`
    is layers.apply_linear. None where one row alone does not repeat its bits under each of
    `thread_counts` (the caller then keeps the thread count fixed and asks again)."""
    p = step.layers[0]
    dtype, device = step.embed.dtype, step.embed.device
    hidden = step.embed.shape[1]  # embed: [vocab, hidden]
    inner = step.num_heads * step.head_dim
    mlp = _out_features(p.gate_up, linear, hidden, dtype, device) // 2
    kinds = {"qkv": (lambda t: linear(t, p.qkv, p.qkv_bias), hidden),
             "o": (lambda t: linear(t, p.o), inner),
             "gate_up": (lambda t: linear(t, p.gate_up), hidden),
             "down": (lambda t: linear(t, p.down), mlp),
             "lm_head": (lambda t: linear(t, step.lm_head), hidden)}
    tiles = RowTiles()
    with torch.inference_mode():
        for kind, (product, in_features) in kinds.items():
            rows = largest_tile(paired(product), in_features, dtype, device, thread_counts)
            if rows == 0:
                return None
            tiles.rows[kind] = rows
    return tiles


def _out_features(w, linear: Callable, hidden: int, dtype, device) -> int:
    with torch.inference_mode():
        return linear(torch.zeros(1, 1, hidden, dtype=dtype, device=device), w).shape[-1]
