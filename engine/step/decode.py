"""Forward passes over the engine's cache: a prefill chunk, and the one-token decode step.

The decode step takes the fastest path the model and device allow:
- "graph": the family step (models/layers.py, Gemma 3's models/gemma_step.py) captured as CUDA
  graphs, one per KV-length bucket, replayed with the token and position in static tensors;
- "static": the same step run eagerly (CPU, or where capture failed): the graph's reference;
- "generic": transformers' own modules with the engine's attention (every architecture).
`verify` runs a block of T tokens and returns every position's logits (speculative decoding); in
"graph" mode each (T, bucket) pair can be captured too (`capture_blocks`). `DecodeEngine` is the
face a session decodes through: a Decoder's, or a tensor-parallel leader's (parallel/).
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import torch

from engine.attention import paged
from engine.attention.prefill import StepContext
from engine.cache.kv_cache import KVCache
from engine.config.backends import Backends
from engine.formats import families
from engine.models import fused_ops, invariant
from engine.models.gemma_step import step_of
from engine.models.layers import FamilyStep, apply_linear
from engine.models.step_weights import supports
from engine.quant import int4_rows
from engine.step.prefill_graphs import PrefillGraphs

MIN_BUCKET = 256
SHORT_PREFILL = 64  # tokens: a prefill chunk this short runs the family step (forward)
KERNEL_PREFILL = 4096  # and so does any chunk that ends within this many tokens of the start:
# faster than transformers' modules over SDPA for short and middling prompts, but the decode
# kernel's row tiles do not keep up with flash attention over long KV


def kv_buckets(context: int) -> list[int]:
    """KV lengths a decode step attends over: powers of two up to the context, then it."""
    sizes, b = [], MIN_BUCKET
    while b < context:
        sizes.append(b)
        b *= 2
    return [*sizes, context]


def bucket(buckets: list[int], end: int) -> int:
    """The smallest KV bucket that holds positions below `end` (a pass ending there)."""
    return next(b for b in buckets if b >= end)


def kernel_prefill(backends: Backends) -> int | float:
    """The furthest position a prefill chunk may end at and still run the family step and the
    decode kernel (chunks of at most SHORT_PREFILL tokens run it wherever they end): the
    session's setting."""
    return backends.kernel_prefill_bound(KERNEL_PREFILL)


@runtime_checkable
class DecodeEngine(Protocol):
    """What a session prefills, decodes and verifies through: one device's Decoder (a split
    model's session holds parallel/leader.py's TPLeader instead, whose ranks run batches only).
    Logits returned may live in a graph's static buffer: use them before the next call."""

    cache: KVCache  # this process's (rank 0's): the tokens it holds, its blocks
    mode: str  # "graph" | "static" | "generic"
    notes: list[str]  # what setup chose, for the load event
    block_graphs: dict  # (T, bucket) -> a captured verify block
    fixed_threads: bool  # the reproducible mode holds under this CPU thread count only

    def setup_fast_path(self, allow_graph: bool, compile_layers: bool,
                        reproducible: tuple[int, ...] | None = None) -> None: ...

    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """ids [T] at start.. -> the last position's logits [V] (a prefill chunk)."""

    def step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """token [1] at position -> logits [V]."""

    def verify(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """ids [T] at start.. -> every position's logits [T, V]."""

    def capture_blocks(self, sizes) -> None: ...


class Decoder:
    """The decode paths over one model's step. Given a `family` step (a tensor-parallel rank's,
    which has no transformers modules: `model` None), it starts "static" and prefills through
    that step."""

    def __init__(self, model: torch.nn.Module | None, cache: KVCache, device: torch.device,
                 family: FamilyStep | None = None):
        self.model, self.cache, self.device = model, cache, device
        self.mode = "generic" if family is None else "static"
        self.notes: list[str] = []
        self.family = family
        self.buckets = kv_buckets(cache.max_len)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.token = torch.zeros(1, dtype=torch.long, device=device)  # graph inputs
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        # (T, bucket) -> (graph, its token input [T], its logits [T, V]); all read block_start
        self.block_graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor,
                                                       torch.Tensor]] = {}
        self.block_start = torch.zeros(1, dtype=torch.long, device=device)
        self.prefill_graphs: PrefillGraphs | None = None  # prefill chunks as graphs (mode graph)
        self.reproducible = False  # make_reproducible: every pass through the family step
        self.fixed_threads = False  # the mode holds under this thread count only

    def setup_fast_path(self, allow_graph: bool, compile_layers: bool,
                        reproducible: tuple[int, ...] | None = None) -> None:
        """Choose the decode path once, at load; say why in `notes` when it is not the fastest.
        `reproducible`: the thread counts the reproducible mode must hold under (None: off);
        it is set up before the graphs are captured, which then hold its pieces."""
        if self.family is None:
            if not supports(self.model):
                covers = families.listing(families.fast_path_types())
                self.notes.append(f"{self.model.config.model_type} decodes through "
                                  f"transformers' modules (the fused step covers {covers})")
                return
            self.family = step_of(self.model, self.cache)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # the unfused weights' blocks, freed by fusing, go back
        self.mode = "static"
        note = fused_ops.prepare(self.family, self.device, compile_layers)
        for n in (note, getattr(self.family, "kernel_note", None)):  # (a mixture of experts')
            if n:
                self.notes.append(n)
        if reproducible is not None:
            self._reproducible(reproducible)
        elif self.device.type == "cuda" and self.cache.backends.int4_rows == "measure":
            # before capture
            layers = self.family.layers
            note = int4_rows.tune([getattr(p, f) for p in layers for f in
                                   ("qkv", "o", "gate_up", "down")] + [self.family.lm_head])
            if note:
                self.notes.append(note)
        if self.device.type != "cuda":
            self.notes.append("CPU: the decode step runs eagerly (CUDA graphs need a GPU)")
            return
        if not allow_graph:
            self.notes.append("CUDA graphs are off for this weight format; decode runs eagerly")
            return
        try:
            t0 = time.perf_counter()
            self.capture()
            self.notes.append(f"decode step captured as {len(self.graphs)} CUDA graphs in "
                              f"{time.perf_counter() - t0:.2f} s")
            if self.cache.backends.prefill_graphs == "on":
                self.prefill_graphs = PrefillGraphs.of(self)
        except Exception as e:  # capture is an optimization: eager still computes the same
            self.graphs.clear()
            self.notes.append(f"CUDA graph capture failed ({type(e).__name__}: {e}); "
                              "decode runs eagerly")

    def _reproducible(self, thread_counts: tuple[int, ...]) -> None:
        try:
            self.notes.append(self.make_reproducible(thread_counts))
        except RuntimeError:
            if len(thread_counts) < 2:
                raise
            self.notes.append(self.make_reproducible() + "; the CPU thread count stays fixed "
                              "(a row's bits change with it here)")
            self.fixed_threads = True

    def make_reproducible(self, thread_counts: tuple[int, ...] = ()) -> str:
        """The reproducible mode (models/invariant.py): products in tiles calibrated here
        (each row's bits alone under each of `thread_counts`), every prefill chunk and verify
        block through the family step with attention per row, verify blocks eager. Raises
        RuntimeError where one row alone does not repeat its bits under those counts.
        -> a note for the load event."""
        if self.family is None:
            raise RuntimeError("the reproducible mode needs the engine's own step")
        tiles = invariant.calibrate(self.family, apply_linear, thread_counts)
        if tiles is None:
            raise RuntimeError("a product of one row does not repeat its bits here")
        self.family.make_reproducible(tiles, lambda end: bucket(self.buckets, end))
        self.block_graphs.clear()
        self.reproducible = True
        return f"reproducible: products in tiles of rows ({tiles.describe()})"

    @torch.inference_mode()
    def capture(self) -> None:
        """The decode step as one CUDA graph per KV bucket -> mode "graph"; raises where capture
        fails (setup_fast_path then stays eager; a tensor-parallel rank fails)."""
        self.pos.zero_()
        bodies = {b: (lambda b=b: self.family(self.token, self.pos, b)) for b in self.buckets}
        self.graphs = capture_graphs(bodies)
        self.cache.crop(0)  # warm-up wrote K/V at position 0 (the scratch block: no blocks yet)
        self.mode = "graph"

    @torch.inference_mode()
    def capture_blocks(self, sizes) -> None:
        """Capture the verify block for each size T in `sizes` (K + 1) and each KV bucket.

        On any failure the blocks stay eager, which computes the same. Warm-up and capture write
        K/V at the tail of the cache, past anything a later turn reuses, so this may run between
        generations.
        """
        todo = sorted({T for T in sizes if T > 1} - {T for T, _ in self.block_graphs})
        if self.mode != "graph" or not todo or self.reproducible:  # its blocks need host rows
            return
        tail = self.cache.max_len - max(todo)
        self.cache.crop(min(len(self.cache.token_ids), tail))
        self.block_start.fill_(tail)
        inputs = {T: torch.zeros(T, dtype=torch.long, device=self.device) for T in todo}
        bodies = {(T, b): (lambda T=T, b=b: self._block(inputs[T], b))
                  for T in todo for b in self.buckets}
        t0 = time.perf_counter()
        try:
            for (T, b), (graph, logits) in capture_graphs(bodies).items():
                self.block_graphs[(T, b)] = (graph, inputs[T], logits)
            self.notes.append(f"verify blocks of {todo[0]}-{todo[-1]} tokens captured as "
                              f"{len(bodies)} CUDA graphs in {time.perf_counter() - t0:.2f} s")
        except Exception as e:  # an optimization: the eager block computes the same
            self.notes.append(f"verify-block capture failed ({type(e).__name__}: {e}); "
                              "verification runs eagerly")

    def _block(self, tokens: torch.Tensor, kv_len: int) -> torch.Tensor:
        """The captured body: positions block_start.. read from a device tensor."""
        pos = self.block_start + torch.arange(tokens.numel(), device=self.device)
        return self.family.block(tokens, pos, kv_len)

    def _model(self, ids: torch.Tensor, start: int, keep: int) -> torch.Tensor:
        """transformers' modules over ids [T] at start.. -> logits of the last `keep` (0: all)."""
        end = start + ids.numel()
        positions = torch.arange(start, end, device=self.device)
        out = self.model(input_ids=ids[None], position_ids=positions[None], use_cache=False,
                         logits_to_keep=keep, hearth_step=StepContext(self.cache, positions,
                                                                      start, end))
        return out.logits[0]

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """ids: [T] int64 at positions start..start+T-1 -> logits of the last one, [V].

        A short chunk (a chat's next message after its cached history) or one that ends within
        kernel_prefill() tokens (a prompt, a draft's catch-up on it) runs the family step,
        whose attention is the decode kernel reading the blocks in place, where that kernel
        runs: one pass of the engine's own layer instead of transformers' modules over a copy
        of the whole history; up to prefill_graphs.MAX_TOKENS it replays as a CUDA graph. A rank
        of tensor parallelism (no transformers modules) prefills through its step's flash path."""
        if self.model is None:
            return self.family.prefill(ids, start)
        T = ids.numel()
        if self.reproducible:  # each row as its own decode step would compute it
            self.cache.reserve(start + T)
            positions = torch.arange(start, start + T, device=self.device)
            return self.family.block(ids, positions, bucket(self.buckets, start + T),
                                     last_only=True, first=start)[-1]
        if self.family_prefills(start, T):
            kv_len = bucket(self.buckets, start + T)
            self.cache.reserve(start + T)
            replayed = self.prefill_graphs and self.prefill_graphs.run(ids, start, kv_len)
            if replayed is not None:
                return replayed
            positions = torch.arange(start, start + T, device=self.device)
            return self.family.block(ids, positions, kv_len, last_only=True, chunk=True)[-1]
        return self._model(ids, start, keep=1)[-1]

    def family_prefills(self, start: int, T: int) -> bool:
        """Whether a prefill chunk of T tokens at start.. runs the family step (forward's fast
        path; a batch's chunks of several sequences run together only where each would)."""
        return (self.family is not None
                and (T <= SHORT_PREFILL or start + T <= kernel_prefill(self.cache.backends))
                and paged.of(self.cache).in_place)

    @torch.inference_mode()
    def verify(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """ids: [T] int64 at positions start..start+T-1 -> logits of every position, [T, V].

        Speculative verification: the pending token and K proposals in one pass. Like `step`,
        the logits may live in a graph's static buffer: use them before the next call.
        """
        if self.mode == "generic":
            return self._model(ids, start, keep=0)
        T = ids.numel()
        kv_len = bucket(self.buckets, start + T)
        self.cache.reserve(start + T)
        captured = self.block_graphs.get((T, kv_len))
        if captured is None:
            return self.family.block(ids, torch.arange(start, start + T, device=self.device),
                                     kv_len, first=start)
        graph, tokens, logits = captured
        tokens.copy_(ids)
        self.block_start.fill_(start)  # a host scalar into the graph's input: no sync
        graph.replay()
        return logits

    @torch.inference_mode()
    def step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """token: [1] int64 on the device, fed at `position` -> logits [V].

        The returned logits may live in a graph's static buffer: use them before the next step.
        """
        if self.mode == "generic":
            return self.forward(token, position)
        kv_len = bucket(self.buckets, position + 1)
        self.cache.reserve(position + 1)  # a new block every block_size steps: no host sync
        if self.mode == "static":
            return self.family(token, torch.tensor([position], device=self.device), kv_len)
        graph, logits = self.graphs[kv_len]
        self.token.copy_(token)
        self.pos.fill_(position)  # a host scalar written into the graph's input: no sync
        graph.replay()
        return logits


def capture_graphs(bodies: dict, pool=None) -> dict:
    """key -> fn() returning a tensor: each warmed up twice off the capture stream (first uses,
    compilation), then captured into one shared pool (`pool`: a graph_pool_handle to add them
    to; default a new one) -> key -> (graph, its output tensor)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in bodies.values():
            for _ in range(2):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    pool = torch.cuda.graph_pool_handle() if pool is None else pool
    captured = {}
    for key, fn in bodies.items():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
        captured[key] = (graph, out)
    torch.cuda.synchronize()
    return captured
