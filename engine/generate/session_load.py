"""How a Session comes to be: its model and draft loaded from a LoadRequest (out of memory
answered with a plan that fits), and its EngineConfig, resolved once: the KV dtype for "auto",
the largest prefill chunk under the allocator's budget, the backend settings and the decode path
they come to on this card. Not generation (session.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from engine.config import overrides
from engine.config.backends import Backends
from engine.config.engine_config import EngineConfig, SpeculationSettings
from engine.events import BadRequest, LoadProgress, LoadRequest
from engine.files.model_folder import check
from engine.formats import families
from engine.formats.model_shape import ModelShape
from engine.generate import template_guard
from engine.generate.reproducible import reproducible_for
from engine.kernels import attention_backend
from engine.load import loader
from engine.models.step_weights import supports
from engine.plan.kv_dtype import PLANNED_WEIGHTS, choose_kv_dtype
from engine.plan.memory import PREFILL_CHUNK, GiB, largest_prefill_chunk
from engine.plan.multi_gpu import rank_shape
from engine.plan.oom import memory_kind, out_of_memory
from engine.platform import allocator
from engine.spec.proposers import check_same_tokenizer

NATIVE_KV = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def allocator_budget(device: torch.device) -> int:
    """What the allocator may take on this GPU (less with --memory-limit)."""
    total = torch.cuda.get_device_properties(device).total_memory
    return int(total * torch.cuda.get_per_process_memory_fraction(device.index or 0))


ARENA_RESERVE_BYTES = 2 * 2**30  # kept free beside a KV arena asked for by size: activations,
ARENA_RESERVE_SHARE = 0.10  # graphs and the prefill pass (the larger of the two)


def arena_blocks(kv_tokens: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 kv_dtype: str, device: torch.device, budget: int | None) -> int:
    """Blocks for an arena of kv_tokens tokens; on a GPU at most what fits in the allocator's
    budget beside what is allocated now and a reserve (continuous batching then preempts
    instead of running out of memory)."""
    from engine.cache.kv_cache import BLOCK_SIZE, KVArena

    want = -(-kv_tokens // BLOCK_SIZE)
    per_block = KVArena.bytes_per_block(num_layers, num_kv_heads, head_dim, BLOCK_SIZE, kv_dtype)
    if device.type != "cuda":  # the computer's RAM: refused in one sentence rather than an
        # allocation failure that blames the model
        from engine.plan.ram import available_ram_bytes

        free = available_ram_bytes()
        if want * per_block > free - ARENA_RESERVE_BYTES:
            raise BadRequest(f"a KV cache of {kv_tokens:,} tokens needs "
                             f"{want * per_block / 2**30:,.1f} GiB; this computer has "
                             f"{free / 2**30:,.1f} GiB of RAM free; ask for fewer (--kv-tokens)")
        return want
    if budget is None:
        return want
    room = budget - torch.cuda.memory_reserved(device) - arena_reserve(budget)
    return max(1, min(want, room // per_block))


def open_cache(lm: loader.LoadedModel, config: EngineConfig, kv_dtype: str):
    """The session's KV cache: an arena of config.kv_tokens (None: the context); a family that
    masks its local layers (Gemma 2, 3) keeps only their window, in rings that cover the
    longest pass (the prefill chunk, a batch's step of one token a row)."""
    from engine.cache.kv_cache import KVCache

    cfg = lm.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    num_blocks = None
    if config.kv_tokens is not None:
        num_blocks = arena_blocks(config.kv_tokens, cfg.num_hidden_layers, kv_heads, head_dim,
                                  kv_dtype, lm.device, config.allocator_budget_bytes)
    sliding, window = (), None
    family = families.get(getattr(cfg, "model_type", None))
    if family is not None and family.sliding_layers and getattr(cfg, "layer_types", None):
        sliding = tuple(i for i, t in enumerate(cfg.layer_types) if t == "sliding_attention")
        window = getattr(cfg, "sliding_window", None)
    return KVCache(cfg.num_hidden_layers, kv_heads, head_dim, lm.context, kv_dtype, lm.device,
                   backends=config.backends, num_blocks=num_blocks, sliding_layers=sliding,
                   window=window, max_pass=config.prefill_chunk)


def arena_reserve(budget: int) -> int:
    """What a KV arena asked for by size leaves free of the allocator's budget: the largest
    prefill pass's activations are planned within half of it (prefill_chunk_for)."""
    return max(ARENA_RESERVE_BYTES, int(budget * ARENA_RESERVE_SHARE))


def kv_dtype_for(lm: loader.LoadedModel, requested: str, budget: int | None = None
                 ) -> tuple[str, str]:
    """(KV dtype name, why): as asked, or for "auto" the model's own dtype unless the planner
    finds memory tight on this GPU under `budget` (plan/kv_dtype.py)."""
    native = NATIVE_KV[lm.compute_dtype]
    if requested != "auto":
        return requested, "as asked"
    if lm.device.type != "cuda":
        return native, f"auto: the model's own {native} on the CPU"
    cc = torch.cuda.get_device_capability(lm.device)
    try:
        shape = ModelShape.from_config(lm.folder.config)
        budget = allocator_budget(lm.device) if budget is None else budget
        return choose_kv_dtype(native, shape, lm.quant, lm.context, budget, cc)
    except Exception:  # the planner cannot read this config: the model's own dtype
        return native, f"auto: the model's own {native} (the planner cannot size this model)"


def prefill_chunk_for(lm: loader.LoadedModel, kv_dtype: str, budget: int | None = None,
                      world_size: int = 1) -> int:
    """The planner's choice on a GPU (under `budget`, for one rank's share of the model under
    tensor parallelism); the smallest pass on CPU."""
    if lm.device.type != "cuda":
        return PREFILL_CHUNK
    quant = lm.quant if lm.quant in PLANNED_WEIGHTS else "bf16"
    try:
        shape = ModelShape.from_config(lm.folder.config)
        if world_size > 1:
            shape = rank_shape(shape, world_size)
        budget = allocator_budget(lm.device) if budget is None else budget
        # half the arena's reserve: the rest holds graphs, cuBLAS's workspaces, the logits and
        # the allocator's slack (a 24 GiB card's 8K-token pass filled its reserve to 30 MiB)
        return largest_prefill_chunk(shape, quant, kv_dtype, lm.context, budget,
                                     most_activation_bytes=arena_reserve(budget) // 2)
    except Exception:  # the planner cannot read this config: stay with the safe size
        return PREFILL_CHUNK


def resolve_config(lm: loader.LoadedModel, kv_dtype: str = "auto", fast_path: bool = True,
                   compile_layers: bool = False, speculation: SpeculationSettings | None = None,
                   backends: Backends | None = None, world_size: int = 1,
                   reserved_bytes: int = 0, reproducible: bool | None = None,
                   kv_tokens: int | None = None) -> EngineConfig:
    """The session's configuration, once: the allocator's budget (less `reserved_bytes`, say
    NCCL's buffers) read once and used by the KV dtype's and the prefill chunk's choices; the
    backend settings (None: the developer overrides, read here) and the decode path they give
    on this device."""
    backends = overrides.backends() if backends is None else backends
    on_gpu = lm.device.type == "cuda"
    budget = allocator_budget(lm.device) - reserved_bytes if on_gpu else None
    kv, why = kv_dtype_for(lm, kv_dtype, budget)
    mode, mode_why = reproducible_for(
        reproducible, lm.device.type, family_step=fast_path and supports(lm.model),
        world_size=world_size, compile_layers=compile_layers,
        model_type=getattr(lm.model.config, "model_type", ""))
    return EngineConfig(
        model=str(lm.folder.path), device=str(lm.device), quant=lm.quant,
        compute_dtype=NATIVE_KV.get(lm.compute_dtype, str(lm.compute_dtype)),
        context=lm.context, kv_dtype=kv, kv_reason=why,
        prefill_chunk=prefill_chunk_for(lm, kv, budget, world_size),
        allocator_budget_bytes=budget, fast_path=fast_path,
        # LLM.int8's outlier columns have data-dependent shapes: no graph capture
        allow_graph=lm.quant != "int8", compile_layers=compile_layers, world_size=world_size,
        speculation=speculation or SpeculationSettings(), backends=backends,
        decode_attention=attention_backend.choose(str(lm.device), kv, backends.decode_attention),
        allocator=allocator.configure() if on_gpu else "", reproducible=mode,
        reproducible_reason=mode_why, kv_tokens=kv_tokens)


def load_session(cls, req: LoadRequest, progress: Callable[[LoadProgress], None],
                 cancel: threading.Event | None):
    """cls(...) over the loaded model, its draft attached. Raises oom.OutOfMemory (memory
    released, a hint that fits) when the card is full."""
    try:
        return _load(cls, req, progress, cancel)
    except Exception as e:  # torch.OutOfMemoryError, or the CPU allocator's RuntimeError
        kind = memory_kind(e)
        if kind is None:
            raise
    # answered out of the except block: its traceback holds the half-loaded model
    config = check(req.model).config
    vram = int(req.memory_limit_gib * GiB) if req.memory_limit_gib else None
    where = "this GPU's memory" if kind == "GPU" else "this computer's memory (RAM)"
    raise out_of_memory(f"the model does not fit in {where}", config, req.quant,
                        req.context or config.get("max_position_embeddings") or 4096, vram,
                        on_cpu=kind == "CPU")


def _load(cls, req: LoadRequest, progress: Callable[[LoadProgress], None],
          cancel: threading.Event | None):
    req.validate()
    folder = check(req.model)
    tok = draft_tok = None
    if req.draft is not None:  # a wrong draft fails before any weights load
        from transformers import AutoTokenizer

        tok, draft_tok = (AutoTokenizer.from_pretrained(f.path, trust_remote_code=False)
                          for f in (folder, check(req.draft)))
        check_same_tokenizer(tok, draft_tok, req.draft)
    backends = overrides.backends()  # the developer overrides: read once a load (a value
    # not understood fails it here, naming its variable)
    template_guard.prewarm()  # the chat template's renderer starts while the weights load
    lm = loader.load(folder, req, progress, cancel, tokenizer=tok, backends=backends)
    config = resolve_config(lm, req.kv_dtype, not req.eager, req.compile,
                            SpeculationSettings(req.num_speculative_tokens), backends,
                            reproducible=req.reproducible, kv_tokens=req.kv_tokens)
    session = cls(lm, config=config)
    if req.draft is not None:
        session.attach_draft(_load_draft(cls, req, lm, progress, cancel, draft_tok))
    return session


def _load_draft(cls, req: LoadRequest, lm: loader.LoadedModel,
                progress: Callable[[LoadProgress], None], cancel, tokenizer):
    folder = check(req.draft)
    dreq = LoadRequest(model=req.draft, device=lm.device.type, context=lm.context,
                       eager=req.eager, compile=req.compile)
    tagged = lambda e: progress(LoadProgress(f"draft {e.stage}", e.done, e.total,
                                             e.message and f"draft: {e.message}"))
    backends = overrides.backends()
    try:
        dlm = loader.load(folder, dreq, tagged, cancel, tokenizer=tokenizer, backends=backends)
    except BadRequest as e:
        raise BadRequest(f"draft model: {e}") from None
    # the draft only proposes: the main model's verification decides every token
    return cls(dlm, config=resolve_config(dlm, "auto", not req.eager, req.compile,
                                          backends=backends, reproducible=False))
