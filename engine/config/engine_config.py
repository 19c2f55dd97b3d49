"""EngineConfig: what a load resolved, once, from its LoadRequest, the planner and the backend
settings; handed down to what runs (the cache, the decode step, the kernels) and reported in the
Loaded event. Frozen: a session that needs other settings is loaded again. No torch here."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.config.backends import Backends

MAX_SEQS = 64  # generations that run together in one batch: the Engine's, hearth serve --max-seqs


@dataclass(frozen=True)
class SpeculationSettings:
    """num_speculative_tokens: a fixed K (None: adaptive K). adaptive: K follows the acceptance
    rate; switch_off: speculation pauses where it does not pay (tests and benchmarks turn them
    off to speculate every step)."""

    num_speculative_tokens: int | None = None
    adaptive: bool = True
    switch_off: bool = True


@dataclass(frozen=True)
class EngineConfig:
    """device, quant, compute_dtype, context: the loader's placement. kv_dtype and kv_reason:
    the cache's dtype and why. prefill_chunk: the longest prefill pass. allocator_budget_bytes:
    what torch's allocator may take on the GPU (less with --memory-limit; None on a CPU), for
    one rank's share under tensor parallelism. decode_attention: the path backends'
    setting came to on this device at load (a kernel that fails its load check is recorded in
    the session's kernel health, not here)."""

    model: str
    device: str
    quant: str
    compute_dtype: str
    context: int
    kv_dtype: str
    kv_reason: str
    prefill_chunk: int
    allocator_budget_bytes: int | None = None
    fast_path: bool = True
    allow_graph: bool = True
    compile_layers: bool = False
    world_size: int = 1
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    backends: Backends = field(default_factory=Backends)
    decode_attention: str = ""
    allocator: str = ""  # torch's CUDA allocator settings in force ("" on a CPU)
    reproducible: bool = False  # the reproducible mode (models/invariant.py)
    reproducible_reason: str = ""  # why it is on or off, for the load event
    kv_tokens: int | None = None  # the KV arena, for every sequence together (None: context)

    def as_dict(self) -> dict:
        """JSON-ready: the Loaded event's `config`."""
        d = asdict(self)
        d["backends"] = self.backends.as_dict()
        return d

    def summary(self) -> str:
        """One line for the load notes: the choices a reader of a benchmark wants to see."""
        b = self.backends
        parts = [f"prefill chunk {self.prefill_chunk:,}",
                 f"decode attention {self.decode_attention or b.decode_attention}",
                 f"fused pieces {b.fused_ops}"]
        if b.kernel_prefill is not None:
            parts.append(f"kernel prefill up to {b.kernel_prefill}")
        if b.int4_kernel:
            parts.append(f"int4 kernel {b.int4_kernel}")
        if b.decode_attention_launch:
            parts.append(f"launch {dict(b.decode_attention_launch)}")
        if self.world_size > 1:
            parts.append(f"all-reduce {b.tp_all_reduce}")
        if self.allocator_budget_bytes is not None:
            parts.append(f"allocator budget {self.allocator_budget_bytes / 2**30:.2f} GiB")
        if self.allocator:
            parts.append(f"allocator {self.allocator}")
        if self.kv_tokens is not None:
            parts.append(f"KV arena {self.kv_tokens:,} tokens")
        parts.append(f"reproducible {'on' if self.reproducible else 'off'} "
                     f"({self.reproducible_reason})")
        return "configuration: " + ", ".join(parts)
