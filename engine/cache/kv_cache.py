"""The engine's KV cache for one sequence at batch 1: a paged arena of fixed-size blocks
(cache/kv_arena.py) drawn on as the conversation grows, through a block table held in a device
tensor, with full blocks shared across conversations by the hash of their token prefix
(cache/block_manager.py).

Not transformers' Cache: the model runs with no transformers cache at all, and the engine's
attention function (attention/prefill.py) and decode step (models/layers.py) write K/V here at
explicit positions, and read it through the attention object over it (attention/paged.py). The
arena and the table are allocated once and never move (captured CUDA graphs hold
their addresses); the table's entries change in place, from the host, between steps. In int8 or
fp8 every token is quantized as it is written (kernels/kv_quant.py), before anything reads it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.cache import key_rotation, kv_arena
from engine.cache.block_manager import BlockManager, Sequence
from engine.cache.device_table import DeviceTable
from engine.cache.kv_arena import STORAGE, KVArena  # noqa: F401 (STORAGE re-exported)
from engine.cache.sliding_pool import SlidingPool, recompute_start, ring_blocks
from engine.config.backends import Backends
from engine.formats import kv_dtypes
from engine.kernels import attention_backend
from engine.kernels.attention_backend import KernelHealth
from engine.plan.memory import KV_BLOCK_SIZE

# tokens a block (plan.KV_BLOCK_SIZE, 16): small enough that a short system prompt fills a
# shareable block and a chat wastes under a block at its tail; the Triton kernel loads keys one
# by one through the table, so its tiles need not match it
BLOCK_SIZE = KV_BLOCK_SIZE


class LayerKV(NamedTuple):
    """One layer's arena: k, v [num_blocks, H_kv, B, D]; k_scale, v_scale [num_blocks, H_kv, B,
    NG] fp16 or None (kernels/kv_quant.py); table [max_blocks] int32: position p at block
    table[p // B], slot p % B."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    table: torch.Tensor


class KVCache:
    """K and V of one sequence of up to `max_len` tokens, in blocks of an arena of `num_blocks`
    (default: just enough for max_len; blocks the live sequence does not use keep earlier
    conversations' prefixes until they are needed).

    `token_ids` are the tokens whose K/V sit at positions 0..len-1 (what a later turn may reuse);
    callers extend it after writing. Positions are written only below `reserve`'s bound.
    `share_prefixes`: look up a new prompt's blocks by hash (off for tensor-parallel ranks, whose
    followers never see the leader's cache decisions: they keep one position-to-block mapping).
    `backends`: the session's backend settings (EngineConfig.backends; None: the
    defaults), which decide how steps read and write it; `health`: the
    session's record of kernels that failed their load check (one per cache unless shared).

    `sliding_layers` (with `window`): layers that attend within the window (Gemma 2 and 3's
    local layers) keep only a ring of blocks a sequence (cache/sliding_pool.py) in an arena of
    their own, `rings` rings (default: as many as full-length sequences the global arena holds);
    `max_pass`: the longest pass written at once (a prefill chunk), which the ring covers.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype | str, device: torch.device | str, *,
                 block_size: int = BLOCK_SIZE, num_blocks: int | None = None,
                 share_prefixes: bool = True, backends: Backends | None = None,
                 health: KernelHealth | None = None, sliding_layers: tuple[int, ...] = (),
                 window: int | None = None, max_pass: int | None = None,
                 rings: int | None = None):
        self.backends = Backends() if backends is None else backends
        self.health = KernelHealth() if health is None else health
        if isinstance(dtype, str):
            self.kv_dtype = dtype
        else:
            self.kv_dtype = next(name for name, d in STORAGE.items() if d == dtype)
        self.dtype = STORAGE[self.kv_dtype]
        self.quantized = kv_dtypes.get(self.kv_dtype).scaled
        self.max_len, self.block_size = max_len, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.share_prefixes = share_prefixes
        max_blocks = -(-max_len // block_size)
        self.num_blocks = max(num_blocks or 0, max_blocks)  # the live sequence always fits
        # one more block, never handed out: the scratch block that table entries past the
        # sequence's blocks name. Reads there are masked (keys past a query's position); a write
        # there (a step run without reserve: graph warm-up, a test's eager step) lands in it
        # and reads back within its own pass, and never touches a block holding K/V
        self.scratch = self.num_blocks
        self.sliding = frozenset(sliding_layers if window else ())
        full = [i for i in range(num_layers) if i not in self.sliding]
        self.arena = KVArena(len(full), num_kv_heads, head_dim, self.num_blocks + 1,
                             block_size, self.kv_dtype, device)
        self.max_pass = max_pass or max_len
        pool, self.ring_arena = None, None
        if self.sliding:
            ring = min(ring_blocks(window, self.max_pass, block_size), max_blocks)
            n = ring * (rings or max(1, self.num_blocks // max_blocks))
            pool = SlidingPool(n, ring, window, len(self.sliding), block_size, self.max_pass)
            self.ring_arena = KVArena(len(self.sliding), num_kv_heads, head_dim, n + 1,
                                      block_size, self.kv_dtype, device)
        # layer i -> (its arena, its index there)
        index = {i: (self.arena, full.index(i)) for i in full}
        index.update({i: (self.ring_arena, j) for j, i in enumerate(sorted(self.sliding))})
        self._where = [index[i] for i in range(num_layers)]
        self._pool = pool
        self.device = self.arena.k[0].device  # with its index: "cuda:0", as kernels report it
        # R of cache/key_rotation.py: every pass that writes keys here rotates them and its
        # queries by it first (None: keys stored as they come, a 16-bit or fp32 cache)
        rotated = kv_dtypes.get(self.kv_dtype).rotated_keys
        self.key_rotation = key_rotation.matrix(head_dim, self.device) if rotated else None
        self.blocks = BlockManager(self.num_blocks, block_size, pool)
        self.seq = Sequence()
        self._tables = DeviceTable(max_blocks, self.scratch, device)
        self.table = self._tables.tensor  # the global layers' reads and writes
        self._table = self._tables.mirror  # what the device table holds
        # the sliding layers' table (entry i: ring[i % ring size]), and the global layers'
        # writes, which skip the blocks below seq.keep (shared K/V a pass computes again for
        # the sliding layers' sake: block_manager.allocate)
        self._ring_tables = self._write_tables = self._tables
        if self.sliding:
            self._ring_tables = DeviceTable(max_blocks, self._pool.num_blocks, device)
            self._write_tables = DeviceTable(max_blocks, self.scratch, device)
        self.ring_table, self.write_table = self._ring_tables.tensor, self._write_tables.tensor
        self.token_ids: list[int] = []

    # ------------------------------------------------------------------ storage

    def _each(self, name: str) -> list[torch.Tensor] | None:
        if name.endswith("scale") and not self.quantized:
            return None
        return [getattr(arena, name)[j] for arena, j in self._where]

    k = property(lambda self: self._each("k"))  # each layer's, in layer order
    v = property(lambda self: self._each("v"))
    k_scale = property(lambda self: self._each("k_scale"))
    v_scale = property(lambda self: self._each("v_scale"))

    @property
    def num_bytes(self) -> int:
        """Every buffer allocated, scales included: the global layers' arena and the sliding
        layers' rings."""
        return self.arena.num_bytes + (self.ring_arena.num_bytes if self.ring_arena else 0)

    @property
    def bytes_per_token(self) -> int:
        return self.num_bytes // (self.arena.num_blocks * self.block_size)  # scratch included

    @property
    def decode_attention(self) -> str:
        """How decode steps read this cache: "sdpa" (16-bit only), "triton" or "reference".
        Asked by every layer of an eager step: looked up again only when the health changed
        (a kernel failing its load check), the only input that can change after construction."""
        failed = len(self.health.failed)
        if getattr(self, "_backend_for", None) != failed:
            self._backend = attention_backend.backend(self.device, self.kv_dtype,
                                                      self.backends.decode_attention, self.health)
            self._backend_for = failed
        return self._backend

    @property
    def fused_writes(self) -> bool:
        """Whether K/V writes are quantized in one Triton launch (kernels/kv_write_kernel.py):
        an int8/fp8 cache that the kernel reads, so eager steps and captured graphs agree."""
        return self.quantized and self.decode_attention == attention_backend.KERNEL_READS

    def layer(self, i: int) -> LayerKV:
        """Layer i's arena and the table its reads go through (a sliding layer's ring)."""
        a, j = self._where[i]
        return LayerKV(a.k[j], a.v[j], a.k_scale[j] if self.quantized else None,
                       a.v_scale[j] if self.quantized else None,
                       self.ring_table if i in self.sliding else self.table)

    def write_layer(self, i: int) -> LayerKV:
        """Layer i as a pass writes it: a global layer's table skips the shared blocks below
        seq.keep (their K/V stay as they are; writes there land in the scratch block)."""
        kv = self.layer(i)
        return kv if i in self.sliding else kv._replace(table=self.write_table)

    def past_ring(self, layer: int, num_tokens: int) -> bool:
        """Whether a pass of num_tokens is longer than the ring of sliding layer `layer` covers
        (KVCache's max_pass): its attention reads its own K/V (attention/prefill.py), and only
        its last ring's worth is written."""
        return layer in self.sliding and num_tokens > self.max_pass

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """k, v: [1, H_kv, T, D] at `positions` ([T], int64, same device), below reserve's bound."""
        if self.past_ring(layer, positions.shape[0]):  # the ring's worth, each slot once
            n = self._pool.ring * self.block_size
            positions, k, v = positions[-n:], k[:, :, -n:], v[:, :, -n:]
        arena, j = self._where[layer]
        arena.write(j, self.write_layer(layer).table, positions, k, v, self.fused_writes)

    def read(self, layer: int, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of positions 0..end-1: contiguous copies [1, H_kv, end, D], gathered through the
        table; a 16-bit cache in its own dtype, a quantized one dequantized to `dtype`."""
        arena, j = self._where[layer]
        return arena.gather(j, self.layer(layer).table, end,
                            dtype if self.quantized else self.dtype)

    def stored(self, layer: int, end: int) -> LayerKV:
        """Positions 0..end-1 as stored (values and scales, not dequantized), contiguous:
        k, v [1, H_kv, end, D], scales [1, H_kv, end, NG]; table None. For tests and tools."""
        kv = self.layer(layer)
        get = lambda x: None if x is None else kv_arena.contiguous(x, kv.table, end)
        return LayerKV(get(kv.k), get(kv.v), get(kv.k_scale), get(kv.v_scale), None)

    # ------------------------------------------------------------------ blocks

    def reserve(self, end: int) -> None:
        """Blocks for positions 0..end-1 before a pass writes there (host ints: no sync);
        every pass that writes K/V worth keeping reserves first (Decoder, attention.StepContext,
        the tensor-parallel ranks)."""
        if end <= self.seq.num_tokens:
            return
        if end > self.max_len:
            raise ValueError(f"position {end - 1} is past the cache's {self.max_len} tokens")
        have = len(self.seq.block_ids)
        self.blocks.append(self.seq, end)
        self._sync_table(have)

    def crop(self, length: int) -> None:
        """Forget everything from `length` on: later writes overwrite it, reads stop before it.
        Blocks past it go back to the arena (full ones stay cached by hash until evicted)."""
        self.blocks.commit(self.seq, self.token_ids)
        del self.token_ids[length:]
        # keep_cached: a keyed block cut in two is copied, not rewritten in place, so the
        # conversation it came from still finds it (a next turn that left it: an edit, a switch)
        for src, dst in self.blocks.crop(self.seq, min(length, self.seq.num_tokens),
                                         keep_cached=True):
            self.arena.copy_block(src, dst)
        self._sync_table(0)

    def reusable_prefix(self, ids: list[int]) -> int:
        """How many leading tokens of `ids` already have their K/V in the live sequence."""
        n = 0
        for a, b in zip(self.token_ids, ids, strict=False):
            if a != b:
                break
            n += 1
        return n

    def reuse(self, ids: list[int]) -> int:
        """Get ready to prefill prompt `ids`: -> how many leading tokens need no prefill (at
        most len(ids) - 1: the last token's logits start the answer); token_ids become them.

        Within the live conversation (it shares the longest prefix): crop it there, as for a
        next turn, a regenerate or an edit. Otherwise (a different conversation whose start is
        cached by hash, a shared system prompt say): release the live sequence, whose full
        blocks stay cached, and start a new one over the cached blocks, without copying them.
        """
        self.blocks.commit(self.seq, self.token_ids)
        live = min(self.reusable_prefix(ids), len(ids) - 1)
        cached = 0
        if self.share_prefixes and len(ids) > 1:
            cached = len(self.blocks.cached_prefix(ids[:-1])) * self.block_size
        if cached <= live:
            self.crop(live)
            return live if self._pool is None or self._pool.intact(self.seq, live) else \
                self._recompute(live)
        self.release()
        start = self.blocks.allocate(self.seq, ids)
        self.token_ids = list(ids[:start])
        self._sync_table(0)
        return start

    def _recompute(self, live: int) -> int:
        """The live sequence cropped at `live`, whose sliding K/V before it the ring no longer
        holds: -> where its prefill starts again (sliding_pool.recompute_start), the global
        K/V of the blocks below `live` kept as they are (seq.keep)."""
        keep = live // self.block_size * self.block_size
        start = recompute_start(keep, self._pool.window, self._pool.num_sliding,
                                self.block_size)
        self.seq.keep, self.seq.ring_from = keep, keep
        del self.token_ids[start:]
        self._sync_table(0)
        return start

    def release(self) -> None:
        """Close the live sequence: its blocks go back, its committed full blocks stay cached."""
        self.crop(0)

    def bind(self, table: Sequence) -> None:
        """Make `table` (one of a batch's sequences, its blocks reserved by the scheduler) the
        live sequence, for a pass that runs one sequence (a prefill chunk, a step of a batch of
        one); the device table follows. Until `unbind`, the cache's own token bookkeeping
        (token_ids, crop, reuse) is not in use: the batch's sequences hold theirs."""
        self.seq = table
        self._sync_table(0)

    def unbind(self) -> None:
        """Back to a live sequence of its own, empty (the batch released its sequences)."""
        self.seq = Sequence()
        self.token_ids = []
        self._sync_table(0)

    def clear(self) -> None:
        """Forget everything, cached prefixes included: the next prompt is prefilled whole."""
        self.release()
        pool = self._pool and self._pool.renewed()
        self.blocks = BlockManager(self.num_blocks, self.block_size, pool)
        self._pool = pool

    def _sync_table(self, first: int) -> None:
        """Copy the sequence's block ids from index `first` on into the device tables, in place
        (the addresses captured graphs read stay); entries past them name the scratch blocks."""
        seq, n = self.seq, len(self.seq.block_ids)
        self._tables.sync(seq.block_ids.__getitem__, n, first)
        if self.sliding:
            ring, size, low = seq.ring, self._pool.ring, seq.keep // self.block_size
            self._ring_tables.sync(lambda i: ring[i % size], n, first)
            self._write_tables.sync(lambda i: self.scratch if i < low else seq.block_ids[i], n,
                                    first)
