"""Prefill chunks replayed as CUDA graphs: a chunk of T tokens runs the graph of its token
bucket (the next power of two from MIN_TOKENS), its tail padded, one graph per (bucket, KV
bucket), captured the first time that pair comes up.

Why: an eager prefill of a few hundred tokens is bound by its host, not its GPU (a 7B's
512-token prefill took 24 ms of host calls in bf16 for 12 ms of kernels, and AWQ's
dequantizing launches added 10 ms more), and a chat's next message, a few dozen tokens,
costs as many host calls as a prompt. A replay costs one launch.

Padding is harmless to the real tokens: the pad rows sit after them, so causal attention keeps
them out of every real row; their K/V land past the sequence's end (slots of its last block
that a later token overwrites before anything reads it, or the scratch block past it), and only
the last real row's logits are kept. The padded rows change the products' row counts, so a
replay's bits may differ from the eager chunk's as a different chunk length's would; the
reproducible mode never comes here.
"""

from __future__ import annotations

import torch

from engine.cache.kv_cache import KVCache
from engine.plan.sizes import PREFILL_GRAPH_TOKENS

MIN_TOKENS = 16  # the smallest token bucket
MAX_TOKENS = PREFILL_GRAPH_TOKENS  # longer chunks run eagerly: their host work is a small part
# of their time, and the pool keeps its largest bucket's activations (the planner counts them)
MAX_GRAPHS = 32  # (token bucket, KV bucket) pairs captured at most; the rest run eagerly


def token_bucket(T: int) -> int:
    """The bucket a chunk of T tokens is padded to."""
    return max(MIN_TOKENS, 1 << (T - 1).bit_length())


class PrefillGraphs:
    """The captured chunks of one Decoder's family step (its mode "graph"): `run` replays one,
    or captures it first."""

    def __init__(self, family, cache: KVCache, device: torch.device,
                 notes: list[str] | None = None):
        self.family, self.cache, self.device = family, cache, device
        self.notes = notes  # where a failed capture says so (the Decoder's load notes, which
        # `hearth bench` and later load events read)
        self.start = torch.zeros(1, dtype=torch.long, device=device)  # the chunk's first position
        self.last = torch.zeros(1, dtype=torch.long, device=device)  # its last real row
        self.inputs: dict[int, torch.Tensor] = {}  # token bucket -> its tokens [bucket]
        # (token bucket, KV bucket) -> (graph, logits [1, V])
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.failure: str | None = None  # why capture stopped (then every chunk runs eagerly)

    @classmethod
    def of(cls, decoder) -> PrefillGraphs:
        """A Decoder's (step/decode.py): its family step, cache, device and notes."""
        return cls(decoder.family, decoder.cache, decoder.device, decoder.notes)

    def run(self, ids: torch.Tensor, start: int, kv_len: int) -> torch.Tensor | None:
        """ids [T] at start.. (their blocks reserved) -> the last one's logits [V] (a graph's
        static buffer: use them before the next call), or None where the chunk does not replay
        (too long, its padding past the cache's table, no graph left for this pair, capture
        off): the caller runs it eagerly."""
        T = ids.numel()
        Tb = token_bucket(T)
        captured = self.graphs.get((Tb, kv_len))
        if (self.failure is not None or T > MAX_TOKENS or start + Tb > self.cache.max_len
                or (captured is None and len(self.graphs) >= MAX_GRAPHS)):
            return None
        tokens = self.inputs.get(Tb)
        if tokens is None:
            tokens = self.inputs[Tb] = torch.zeros(Tb, dtype=torch.long, device=self.device)
        tokens[:T].copy_(ids)  # the pad rows keep earlier ids: any valid ids will do
        self.start.fill_(start)  # host scalars into the graph's inputs: no sync
        self.last.fill_(T - 1)
        if captured is None:
            return self._capture(Tb, kv_len)
        graph, logits = captured
        graph.replay()
        return logits[0]

    def _body(self, Tb: int, kv_len: int) -> torch.Tensor:
        pos = self.start + torch.arange(Tb, device=self.device)  # [Tb]
        return self.family.block(self.inputs[Tb], pos, kv_len, keep=self.last, chunk=True)

    def _capture(self, Tb: int, kv_len: int) -> torch.Tensor:
        """Run the chunk eagerly (its real result: the K/V it writes and the logits returned;
        every kernel's first use), then capture it; a failure turns capture off for good."""
        logits = self._body(Tb, kv_len)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self._body(Tb, kv_len)
            self.graphs[(Tb, kv_len)] = (graph, out)
        except Exception as e:  # an optimization: the eager chunk computes the same
            self.failure = f"{type(e).__name__}: {str(e)[:200]}"
            if self.notes is not None:
                self.notes.append(f"prefill chunk capture failed ({self.failure}); prompts "
                                  "run eagerly from now on")
        return logits[0]
