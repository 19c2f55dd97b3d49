"""The planner for several cards: bytes per card when a Llama/Qwen-family model is cut N ways by
tensor parallelism, and the split to recommend when one card is too small.

Pure arithmetic, no torch (the app imports it). A card holds what parallel/sharded_step.py gives a
rank:
1/N of the attention heads, KV heads and MLP columns, 1/N of an untied lm_head (cut by vocabulary),
the whole embedding and the norms; plus, as on one card, its CUDA context, workspace, graph pool
and margin, and NCCL's buffers. The per-card arithmetic is engine.plan.memory's, run on the shape
one
card sees (`rank_shape`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from engine.formats import families, kv_dtypes, weights
from engine.formats.model_shape import ModelShape, PlanError
from engine.plan.choices import sixteen_bit
from engine.plan.memory import (
    CUDA_CONTEXT_BYTES,
    PREFILL_CHUNK,
    QUANTIZED_KV,
    GiB,
    MiB,
    Recommendation,
    plan,
    recommend,
    weight_bytes,
)

# the weights parallel/sharded_step.py cuts today
ENGINE_TP_FORMATS = tuple(n for n in weights.names() if weights.get(n).tensor_parallel)
MAX_DEVICES = 8
# NCCL's own device memory per card: ring buffers for each channel and peer (SIMPLE 4 MiB +
# LL128 ~4.5 MiB + LL ~0.25 MiB; 16-32 channels over NVLink), the p2p buffers the weight transfer
# uses, its work queues. The per-step all-reduces run in place on the linears' outputs, which the
# workspace already counts. An allowance to calibrate against NVML on two GPUs (bench/tp_check.py).
NCCL_BUFFERS_BYTES = 384 * MiB


def split_error(shape: ModelShape, n: int) -> str | None:
    """Why `shape` cannot be cut `n` ways (one sentence), or None when it can."""
    if n == 1:
        return None
    if n < 1:
        return f"a split needs at least one card, got {n}"
    family = families.get(shape.model_type)
    if family is None or not family.tensor_parallel:
        return (f"tensor parallelism covers {families.listing(families.tensor_parallel_types())}; "
                f"this model is {shape.model_type}")
    if shape.num_kv_heads % n or shape.intermediate_size % n:
        return (f"{n} cards do not split this model evenly: each must hold whole KV heads "
                f"({shape.num_kv_heads}) and equal MLP slices ({shape.intermediate_size})")
    return None


def valid_splits(shape: ModelShape, max_devices: int = MAX_DEVICES) -> list[int]:
    return [n for n in range(1, max_devices + 1) if split_error(shape, n) is None]


def rank_shape(shape: ModelShape, n: int) -> ModelShape:
    """The model as one of n cards holds it (the planner's arithmetic then applies as is)."""
    err = split_error(shape, n)
    if err:
        raise PlanError(err)
    if n == 1:
        return shape
    hid, L, d = shape.hidden_size, shape.num_layers, shape.head_dim
    q, kv = shape.num_heads * d // n, shape.num_kv_heads * d // n
    inter = shape.intermediate_size // n
    lin: dict[tuple[int, int], int] = {}
    # (out, in, per layer): q; k and v; o (row-parallel: its input is cut); gate and up; down
    for o, i, c in ((q, hid, 1), (kv, hid, 2), (hid, q, 1), (inter, hid, 2), (hid, inter, 1)):
        lin[(o, i)] = lin.get((o, i), 0) + c * L
    lm_head = 0 if shape.tie_word_embeddings else -(-shape.vocab_size // n) * hid
    return replace(shape, num_heads=shape.num_heads // n, num_kv_heads=shape.num_kv_heads // n,
                   intermediate_size=inter, linears=tuple((o, i, c) for (o, i), c in lin.items()),
                   lm_head_params=lm_head)


def allreduce_bytes(n: int) -> int:
    return 0 if n == 1 else NCCL_BUFFERS_BYTES


def tp_kv_dtype(quant: str, kv_dtype: str = "auto") -> str:
    """The KV cache a split keeps: "auto" is the weights' own 16-bit dtype (bf16 beside weights
    the engine cannot cut, which tp_refusal turns down anyway)."""
    if kv_dtype != "auto":
        return kv_dtype
    return quant if quant in ENGINE_TP_FORMATS else "bf16"


def tp_refusal(quant: str, kv_dtype: str) -> str | None:
    """Why tensor parallelism cannot run these weights with this KV cache yet (a clause), or
    None when it can."""
    if quant not in ENGINE_TP_FORMATS:
        return "tensor parallelism cuts 16-bit weights only so far"
    if kv_dtype in QUANTIZED_KV:
        return "tensor parallelism keeps a 16-bit KV cache so far"
    return None


@dataclass(frozen=True)
class MultiPlan:
    """Bytes on each of `num_devices` cards (they are alike: rank 0 holds no more than the rest)."""

    num_devices: int
    quant: str
    kv_dtype: str
    context: int
    weights_bytes_per_device: int
    kv_bytes_per_token_per_device: int
    kv_bytes_per_device: int
    activation_bytes: int
    cuda_context_bytes: int
    graph_pool_bytes: int
    allreduce_bytes: int
    margin_bytes: int
    total_bytes_per_device: int
    vram_bytes_per_device: int | None
    fits: bool | None  # None when no card was given
    max_context: int
    host_bytes: int  # rank 0 loads the whole model into host memory before it cuts it

    @property
    def total_bytes(self) -> int:
        return self.total_bytes_per_device * self.num_devices

    def to_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes}


def plan_multi(shape: ModelShape, num_devices: int, quant: str, kv_dtype: str, context: int,
               vram_bytes: int | None = None, prefill_chunk: int = PREFILL_CHUNK,
               cuda_context_bytes: int = CUDA_CONTEXT_BYTES) -> MultiPlan:
    """Bytes per card for these settings on `num_devices` cards of `vram_bytes` each."""
    comm = allreduce_bytes(num_devices)
    # NCCL's buffers ride with the CUDA context: fixed bytes on every card, whatever the context
    p = plan(rank_shape(shape, num_devices), quant, kv_dtype, context, vram_bytes, None,
             prefill_chunk, cuda_context_bytes=cuda_context_bytes + comm,
             prefill_graphs=num_devices == 1)  # ranks replay decode steps only
    return MultiPlan(num_devices, p.quant, p.kv_dtype, p.context, p.weights_bytes,
                     p.kv_bytes_per_token, p.kv_bytes, p.activation_bytes, cuda_context_bytes,
                     p.graph_pool_bytes, comm, p.margin_bytes, p.total_bytes, vram_bytes, p.fits,
                     p.max_context, weight_bytes(shape, quant))


@dataclass(frozen=True)
class Split:
    num_devices: int  # 1: no tensor parallelism
    quant: str
    kv_dtype: str
    context: int
    fits: bool | None
    note: str | None
    plan: MultiPlan

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "plan"},
                "plan": self.plan.to_dict(), "summary": self.summary()}

    def summary(self) -> str:
        """One line for `hearth plan` and the app: "needs 2 GPUs: tensor parallel 2, 14.6 GiB per
        GPU (bf16 weights, bf16 KV cache, 8,192 tokens)"."""
        n, per_card = self.num_devices, self.plan.total_bytes_per_device / GiB
        what = f"{self.quant} weights, {self.kv_dtype} KV cache, {self.context:,} tokens"
        if n == 1:
            return f"one GPU: {per_card:.1f} GiB ({what})"
        verb = "needs" if self.fits is not False else "does not fit even"
        return f"{verb} {n} GPUs: tensor parallel {n}, {per_card:.1f} GiB per GPU ({what})"


def recommend_split(shape: ModelShape, vram_bytes: int, num_devices: int,
                    compute_capability=None, context: int | None = None, *, quant: str = "auto",
                    kv_dtype: str = "auto", tp_formats=ENGINE_TP_FORMATS,
                    cuda_context_bytes: int = CUDA_CONTEXT_BYTES) -> Split:
    """How many of `num_devices` cards (each `vram_bytes`) to use, in which format.

    For each possible split, engine.plan.memory's recommendation for the shape one card sees (more
    than
    one card: only `tp_formats`, what the engine can cut). The best wins: one that fits, then the
    weight format (16-bit, INT8, AWQ, NF4), then the KV dtype (16-bit, 8-bit), then the longer
    context, then fewer cards. So one card where it holds the best format at the wanted context;
    a split where one card would need 4-bit weights, an 8-bit cache or a shorter context.
    """
    cc = tuple(compute_capability) if compute_capability else None
    w16 = sixteen_bit(cc)
    auto = quant in ("auto", None)
    if not auto:
        natural = [quant]
    else:  # as engine.plan.memory.recommend: a quantized checkpoint in its own format
        natural = [shape.quant_method] if shape.quant_method else [w16, *weights.fallbacks()]
    options: list[tuple[int, Recommendation]] = []
    for n in valid_splits(shape, num_devices):
        # one card: the planner's whole decision tree; more: each format the engine can cut
        formats = ["auto" if auto else quant] if n == 1 else [f for f in natural if f in tp_formats]
        for q in formats:
            r = recommend(rank_shape(shape, n), vram_bytes, cc, context, quant=q,
                          kv_dtype=kv_dtype, cuda_context_bytes=cuda_context_bytes
                          + allreduce_bytes(n))
            options.append((n, r))

    def rank(o: tuple[int, Recommendation]):
        n, r = o
        return (not r.fits, weights.get(r.quant).quality, r.kv_dtype in kv_dtypes.quantized(),
                -r.context, n)

    one = options[0][1]  # n = 1 comes first
    if not any(r.fits for _, r in options):  # the most cards: the nearest to fitting
        n, r = max(options, key=lambda o: (o[0], -rank(o)[1]))
        note = one.note if n == 1 else (
            f"does not fit {num_devices} cards of {vram_bytes / GiB:.1f} GiB: cut {n} ways, "
            f"{r.quant} weights need cards of at least {r.min_vram_bytes / GiB:.1f} GiB")
    else:
        n, r = min(options, key=rank)
        note = r.note
        if n > 1:
            alone = ("does not fit one card" if not one.fits else
                     f"one card holds {one.quant} weights, KV in {one.kv_dtype}, at "
                     f"{one.context:,} tokens")
            note = (f"{alone}; tensor parallelism over {n} cards (tp={n}) holds {r.quant} "
                    f"weights with the KV cache in {r.kv_dtype} at {r.context:,} tokens")
    if n == 1 and num_devices > 1 and not (r.fits and weights.get(r.quant).quality == 0):
        if len(valid_splits(shape, num_devices)) == 1:
            why = split_error(shape, 2)
        elif not any(f in tp_formats for f in natural):
            why = f"tensor parallelism cuts {'/'.join(tp_formats)} weights only so far"
        else:
            why = f"no split over up to {num_devices} cards does better"
        note = f"{note}; {why}" if note else why
    mp = plan_multi(shape, n, r.quant, r.kv_dtype, r.context, vram_bytes,
                    cuda_context_bytes=cuda_context_bytes)
    return Split(n, r.quant, r.kv_dtype, r.context, r.fits, note, mp)
