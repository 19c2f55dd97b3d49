"""VRAM planner: config.json (+ safetensors headers) -> bytes; and a format recommendation.

Pure arithmetic, no torch: the Qt app imports it. Sizes follow what the engine allocates at batch 1:
weights in the chosen format, a paged KV arena for the whole context (cache/kv_cache.py: the context
rounded up to whole blocks; blocks the live conversation does not use hold cached prefixes of
earlier ones), a prefill-chunk workspace, the CUDA context, the decode graph pool, an optional
draft model and a safety margin (each part's bytes: plan/sizes.py, whose allowances are to be
calibrated against NVML peaks: bench/plan_check.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from engine.formats import kv_dtypes, weights
from engine.formats.model_shape import AWQ_GROUP, ModelShape, PlanError  # noqa: F401 (re-exported)
from engine.plan import experts
from engine.plan.choices import sixteen_bit
from engine.plan.sizes import (  # noqa: F401 (MiB, QUANTIZED_KV, seed_kv_cache_size re-exported)
    CUBLAS_WORKSPACE_BYTES,
    CUDA_CONTEXT_BYTES,
    GRAPH_POOL_BASE_BYTES,
    KV_BLOCK_SIZE,
    PREFILL_CHUNK,
    PREFILL_GRAPH_TOKENS,
    QUANTIZED_KV,
    GiB,
    MiB,
    kv_arena_bytes,
    kv_arena_tokens,
    kv_bytes_per_token,
    margin_bytes,
    ring_tokens,
    seed_kv_cache_size,
    vram_needed,
    weight_bytes,
    workspace_bytes,
)

NUM_SPECULATIVE_TOKENS = 5  # the seed's num_speculative_tokens
MIN_USEFUL_CONTEXT = 1024  # a shorter context than this is no chat: say it does not fit
PCIE_BYTES_PER_S = 25e9  # PCIe 4.0 x16 in practice, for the CPU-offload estimate


@dataclass(frozen=True)
class Plan:
    quant: str
    kv_dtype: str
    context: int  # tokens per sequence the cache holds (capped at a sliding window in force)
    concurrency: int
    prefill_chunk: int
    params: int
    weights_bytes: int
    kv_bytes_per_token: int
    kv_bytes: int
    activation_bytes: int
    cuda_context_bytes: int
    graph_pool_bytes: int
    draft_bytes: int  # draft weights + its KV cache
    margin_bytes: int
    total_bytes: int
    vram_bytes: int | None
    fits: bool | None  # None when no card was given
    max_context: int  # largest context that fits (native / window cap when no card given)
    max_concurrency: int | None  # sequences of `context` tokens that fit at once
    recommended: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # the weights a decode token reads (plan/experts.py: a mixture of experts' active ones)
    active_weights_bytes: int = 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d


def _core(shape: ModelShape, quant: str, kv_dtype: str, context: int, vram: int | None,
          draft: ModelShape | None, chunk: int, seqs: int, spec: int, cuda_ctx: int,
          prefill_graphs: bool = True, device: str = "cuda") -> Plan:
    if context < 1 or chunk < 1 or seqs < 1:
        raise PlanError("context, prefill chunk and concurrency must be positive")
    if context > shape.max_position_embeddings:
        raise PlanError(f"context {context:,} is longer than the model's "
                        f"{shape.max_position_embeddings:,} positions")
    same = quant == shape.quant_method
    w = weight_bytes(shape, quant, shape.double_quant if same else None)
    per_tok = kv_bytes_per_token(shape, kv_dtype)
    # a draft is small: it runs in its checkpoint's own format (16-bit unless quantized)
    d_w = weight_bytes(draft, draft.quant_method or "bf16", draft.double_quant) if draft else 0
    d_tok = kv_bytes_per_token(draft, kv_dtype) if draft else 0
    margin = margin_bytes(vram)
    on_gpu = device == "cuda"  # the CPU (its RAM): no CUDA context, cuBLAS workspace or graphs
    cuda_ctx = cuda_ctx if on_gpu else 0

    def parts(ctx: int, n: int) -> tuple[int, ...]:
        t = min(ctx, shape.context_limit)
        rows = n * (1 + (spec if draft else 0))
        act = workspace_bytes(shape, quant, kv_dtype, chunk, rows, t)
        # + each KV arena's scratch block (cache/kv_cache.py), a decode-side buffer like the graphs'
        scratch = (per_tok + d_tok) * KV_BLOCK_SIZE * n
        graph = (GRAPH_POOL_BASE_BYTES + workspace_bytes(shape, "bf16", "bf16", rows, rows, 0)
                 + scratch + (workspace_bytes(shape, "bf16", "bf16", min(
                     chunk, PREFILL_GRAPH_TOKENS), 1, 0) if prefill_graphs else 0))
        act, graph = (act + CUBLAS_WORKSPACE_BYTES, graph) if on_gpu else (act + scratch, 0)
        d_kv = kv_arena_bytes(draft, kv_dtype, min(ctx, draft.context_limit), n, chunk) \
            if draft else 0
        return w, kv_arena_bytes(shape, kv_dtype, t, n, chunk), act, cuda_ctx, graph, \
            d_w + d_kv, margin

    def fits(ctx: int, n: int) -> bool:
        return vram is None or sum(parts(ctx, n)) <= vram

    lo, hi = 0, shape.context_limit  # largest context that fits: parts() grow with ctx
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid, seqs) else (lo, mid - 1)
    max_ctx, ctx = lo, min(context, shape.context_limit)
    max_seqs = None
    if vram is not None:
        lo, hi = 0, 1
        while fits(ctx, hi) and hi < 1 << 24:
            lo, hi = hi, hi * 2
        while lo < hi - 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(ctx, mid) else (lo, mid)
        max_seqs = lo
    wb, kv, act, cctx, graph, drf, mg = parts(ctx, seqs)
    total = wb + kv + act + cctx + graph + drf + mg
    notes = (f"context capped at the sliding window of {shape.sliding_window:,} tokens",) if (
        context > ctx) else ()
    notes += tuple(filter(None, [experts.note(shape, quant), _rings_note(shape, ctx, chunk)]))
    return Plan(quant, kv_dtype, ctx, seqs, chunk, shape.total_params, wb, per_tok, kv, act, cctx,
                graph, drf, mg, total, vram, None if vram is None else total <= vram, max_ctx,
                max_seqs, notes=notes, active_weights_bytes=experts.active_weight_bytes(
                    shape, quant))


def _rings_note(shape: ModelShape, context: int, chunk: int) -> str | None:
    """The sliding layers' share of the KV cache, where they keep rings (plan/sizes.py)."""
    if not shape.local_layers:
        return None
    ring, n = ring_tokens(shape, context, chunk), shape.num_layers
    return (f"{shape.local_layers} of {n} layers attend within {shape.local_window:,} tokens: "
            f"each keeps {ring:,} token slots a sequence (the window and a {chunk:,}-token "
            f"pass), the other {n - shape.local_layers} the whole context")


@dataclass(frozen=True)
class Recommendation:
    quant: str
    kv_dtype: str
    context: int
    concurrency: int
    fits: bool | None  # None with no card and no memory given
    device: str  # "cuda" | "cpu"
    use_draft: bool
    note: str | None
    min_vram_bytes: int  # the smallest card for this choice at the wanted context
    cards_needed: int | None  # cards of this size with tensor parallelism, when one is too small
    plan: Plan

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "plan"}


def recommend(shape: ModelShape, vram_bytes: int | None, compute_capability=None,
              context: int | None = None, *, quant: str = "auto", kv_dtype: str = "auto",
              concurrency: int = 1, draft: ModelShape | None = None, prefer_quality: bool = False,
              prefill_chunk: int = PREFILL_CHUNK, cuda_context_bytes: int = CUDA_CONTEXT_BYTES,
              prefill_graphs: bool = True, device: str = "cuda") -> Recommendation:
    """The seed's recommend_config made general; the format is chosen for one sequence.

    GPU: bf16 (fp16 below cc 8.0) with a 16-bit KV cache at the wanted context; else the KV cache
    in fp8 (cc >= 8.9) or int8; else INT8 weights (only with prefer_quality); else 4-bit (AWQ for
    an AWQ checkpoint, NF4 otherwise); else a shorter context; else it says plainly that nothing
    fits. A quantized checkpoint is planned in its own format. No card, or device "cpu" with
    `vram_bytes` the computer's free memory: the checkpoint's dtype, the context shortened to fit.
    """
    wanted = context or shape.context_limit

    def core(q: str, k: str, ctx: int, n: int = 1, d: ModelShape | None = draft) -> Plan:
        return _core(shape, q, k, ctx, vram_bytes, d, prefill_chunk, n, NUM_SPECULATIVE_TOKENS,
                     cuda_context_bytes, prefill_graphs, device)

    def need(p: Plan) -> int:
        return vram_needed(p.total_bytes - p.margin_bytes)

    if vram_bytes is None or device == "cpu":
        q = quant if quant != "auto" else (shape.quant_method or shape.native_dtype)
        k = kv_dtype if kv_dtype != "auto" else (
            shape.native_dtype if shape.native_dtype in kv_dtypes.names() else "bf16")
        p = core(q, k, wanted, concurrency)
        note = (f"{'on' if vram_bytes else 'no GPU given: on'} the CPU the checkpoint's own "
                f"dtype ({q})")
        if p.fits is False and p.max_context >= min(MIN_USEFUL_CONTEXT, shape.context_limit):
            p = core(q, k, p.max_context // 256 * 256 or p.max_context, concurrency)
            note += f"; context shortened from {wanted:,} to {p.context:,} tokens to fit"
        elif p.fits is False:
            note += (f"; does not fit: it needs {need(p) / GiB:.1f} GiB and this computer has "
                     f"{vram_bytes / GiB:.1f} GiB of memory free")
        return _loads(shape, Recommendation(q, k, p.context, concurrency, p.fits, "cpu",
                                            draft is not None, note, need(p), None, p))
    cc = tuple(compute_capability) if compute_capability else None
    w16 = sixteen_bit(cc)
    if quant not in ("auto", None):
        ws = [quant]
    elif shape.quant_method:
        ws = [shape.quant_method]
    else:
        ws = [w16, *weights.fallbacks(prefer_quality)]
    # a quantized checkpoint computes in its own 16-bit dtype (AWQ: fp16), so its cache does too
    kv16 = shape.native_dtype if shape.quant_method and shape.native_dtype != "fp32" else w16
    kv16 = "fp16" if w16 == "fp16" else kv16  # a card without bf16
    kv8 = kv_dtypes.eight_bit_for(cc)  # fp8 where the card converts it in hardware
    kvs = [kv_dtype] if kv_dtype not in ("auto", None) else [kv16, kv8]
    cands = [(w, k) for w in ws for k in kvs]

    def pick(d: ModelShape | None) -> tuple[int, Plan]:
        plans = [core(w, k, wanted, 1, d) for w, k in cands]
        for rank, p in enumerate(plans):
            if p.fits:
                return rank, p
        best = max(plans, key=lambda p: p.max_context)  # first of equals: the better quality
        if best.max_context >= min(MIN_USEFUL_CONTEXT, shape.context_limit):
            ctx = best.max_context // 256 * 256 or best.max_context  # a round number of tokens
            return len(cands), core(best.quant, best.kv_dtype, ctx, 1, d)
        return len(cands) + 1, plans[-1]

    rank, p = pick(draft)
    use_draft, notes = draft is not None, []
    if draft is not None and rank > 0:
        rank2, p2 = pick(None)
        if (rank2, -p2.context) < (rank, -p.context):
            rank, p, use_draft = rank2, p2, False
            notes.append("the draft model does not fit alongside; speculative decoding off")
    d = draft if use_draft else None
    fits, seqs, cards = rank <= len(cands), concurrency, None
    if rank == len(cands):
        notes.append(f"context shortened from {min(wanted, shape.context_limit):,} to "
                     f"{p.context:,} tokens to fit")
    if fits and concurrency > 1:
        pc = core(p.quant, p.kv_dtype, p.context, concurrency, d)
        if not pc.fits:
            seqs = max(1, pc.max_concurrency or 0)
            notes.append(f"{concurrency} sequences of {p.context:,} tokens do not fit; {seqs} do")
            pc = core(p.quant, p.kv_dtype, p.context, seqs, d)
        p = pc
    if not fits:
        per_card = p.activation_bytes + p.cuda_context_bytes + p.graph_pool_bytes + p.margin_bytes
        shared = p.weights_bytes + p.kv_bytes + p.draft_bytes
        cards = math.ceil(shared / (vram_bytes - per_card)) if vram_bytes > per_card else None
        streamed = min(p.weights_bytes, p.total_bytes - vram_bytes)
        notes.append(
            f"does not fit: {p.quant} weights with the KV cache in {p.kv_dtype} at {p.context:,} "
            f"tokens need {need(p) / GiB:.1f} GiB and this card has {vram_bytes / GiB:.1f} GiB; use"
            f" a card of at least {need(p) / GiB:.1f} GiB"
            + (f", or {cards} such cards with tensor parallelism (tp={cards}: "
               f"--tensor-parallel {cards}, 16-bit weights)" if cards else "")
            + f", or CPU offload (accelerate device_map='auto') at roughly "
              f"{PCIE_BYTES_PER_S / streamed:.1f} tokens/s")
    elif weights.get(p.quant).fallback and quant in ("auto", None) and not shape.num_experts:
        # (`hearth quantize` takes no mixture of experts: --quant awq rounds one at load)
        notes.append("`hearth quantize --method awq` makes an AWQ copy, closer to bf16 than "
                     f"{p.quant.upper()}")
    return _loads(shape, Recommendation(p.quant, p.kv_dtype, p.context, seqs, fits, "cuda",
                                        use_draft, "; ".join(notes) or None, need(p), cards, p))


def _loads(shape: ModelShape, rec: Recommendation) -> Recommendation:
    """A model the loader refuses (formats/loadable.py) fits nowhere, whatever its bytes."""
    if shape.refusal is None:
        return rec
    return replace(rec, fits=False, cards_needed=None, note=f"it does not load: {shape.refusal}",
                   plan=replace(rec.plan, fits=False, notes=(*rec.plan.notes, shape.refusal)))


def plan(shape: ModelShape, quant: str, kv_dtype: str, context: int | None,
         vram_bytes: int | None = None, draft: ModelShape | None = None,
         prefill_chunk: int = PREFILL_CHUNK, *, compute_capability=None, concurrency: int = 1,
         cuda_context_bytes: int = CUDA_CONTEXT_BYTES, prefill_graphs: bool = True,
         device: str = "cuda") -> Plan:
    """Bytes for these settings; "auto" / None settings are the recommendation's.
    `prefill_graphs`: count the pool of prefill chunks replayed as CUDA graphs (one GPU's
    engine; a tensor-parallel rank replays decode steps only). `device` "cpu": `vram_bytes` is
    the computer's free memory, and nothing of CUDA's is counted."""
    kw = dict(concurrency=concurrency, draft=draft, prefill_chunk=prefill_chunk,
              cuda_context_bytes=cuda_context_bytes, prefill_graphs=prefill_graphs,
              device=device)
    best = recommend(shape, vram_bytes, compute_capability, context, **kw)
    q, k, ctx = quant or "auto", kv_dtype or "auto", context
    if "auto" in (q, k) or ctx is None:
        r = best if (q, k) == ("auto", "auto") else recommend(
            shape, vram_bytes, compute_capability, context, quant=q, kv_dtype=k, **kw)
        q, k, ctx = r.quant, r.kv_dtype, ctx or r.context
    p = _core(shape, q, k, ctx, vram_bytes, draft, prefill_chunk, concurrency,
              NUM_SPECULATIVE_TOKENS, cuda_context_bytes, prefill_graphs, device)
    if shape.refusal is not None:  # sized all the same: the bytes it would take
        p = replace(p, fits=False, notes=(*p.notes, f"it does not load: {shape.refusal}"))
    return replace(p, recommended=best.to_dict())


def largest_prefill_chunk(shape: ModelShape, quant: str, kv_dtype: str, context: int,
                          vram_bytes: int, choices=(16384, 8192, 4096, 2048, 1024, PREFILL_CHUNK),
                          most_activation_bytes: int | None = None) -> int:
    """The longest prefill pass that still fits, its activations within `most_activation_bytes`
    where given (what a batch's KV arena leaves free): fewer, larger passes shorten time to first
    token, and a step's token budget under continuous batching is this pass, so a wave of
    prompts prefills in fewer steps that stall the running decodes."""
    for chunk in choices:
        p = plan(shape, quant, kv_dtype, context, vram_bytes, prefill_chunk=chunk)
        if p.fits and (most_activation_bytes is None
                       or p.activation_bytes <= most_activation_bytes):
            return chunk
    return min(choices)
