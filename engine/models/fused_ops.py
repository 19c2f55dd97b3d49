"""Whether a decode step's small pieces run as one Triton launch each
(kernels/fused_ops_kernel.py): the
norms (eight PyTorch kernels each), SiLU * up (two) and the q/k/v split with RoPE and the K/V
stores (about twenty). Where Triton runs on a GPU, unless the session's fused_ops setting is
"off" (config.Backends; the developer override HEARTH_FUSED_OPS), or
`--compile` fuses them already. Checked at load against the PyTorch pieces on this model's own
weights and a probe cache of its KV dtype; a launch that fails or disagrees leaves them all as
they were.
"""

from __future__ import annotations

import functools

import torch

from engine.cache import kv_arena
from engine.cache.kv_cache import KVCache
from engine.kernels import attention_backend

NOTE = "norms, SiLU * up and RoPE with the K/V stores: one Triton launch each"
PROBE_TOKENS = 64  # the probe cache the RoPE piece writes into at load
TOLERANCE = 1e-2  # relative: the two round alike step for step (the interpreter tests see 0 to
# 1e-7 in fp32, 0 to 7e-6 in fp16); a wrong row or column moves whole values (about 1.4)
READ_BACK_TOLERANCE = 0.1  # int8/fp8 K/V read back: where the 16-bit inputs differ by their
# rounding, a code moves one step, and one e4m3 step is up to 12.5% of a value (at TOLERANCE a
# bf16 probe over fp8 failed and left the step unfused)


def wanted(device: torch.device, setting: str = "auto") -> bool:
    """`setting`: the session's Backends.fused_ops."""
    if setting not in ("auto", "off"):
        raise ValueError(f"fused_ops must be auto or off, not {setting!r}")
    return setting == "auto" and device.type == "cuda" and attention_backend.triton_available()


def compile_pieces(step, device: torch.device | None = None) -> None:
    """Fuse the small ops between linear layers (norms, RoPE, residuals, cache writes) with
    torch.compile: each piece compiles once and serves every layer, whatever format the
    linears are in. Its kernels launch as programmatic dependents where a step's Triton pieces
    do (kernels/fused_ops_kernel.py pdl_options) and this torch's Inductor can."""
    import torch._dynamo.config as dynamo
    import torch._inductor.config as inductor

    # one compiled version per token count: the step, each speculative verify block and each
    # batched step's row count
    dynamo.recompile_limit = max(dynamo.recompile_limit, 32)
    options = {}
    if device is not None and device.type == "cuda" and hasattr(inductor.triton, "enable_pdl"):
        from engine.kernels.fused_ops_kernel import pdl_options

        if pdl_options(device, 1).get("launch_pdl"):  # as the Triton pieces of a step launch
            options["triton.enable_pdl"] = True
    step.fns = {name: torch.compile(fn, fullgraph=True, dynamic=False, options=options or None)
                for name, fn in step.fns.items()}


def prepare(step, device: torch.device, compile_layers: bool) -> str | None:
    """The step's small pieces at load, for a Decoder and a tensor-parallel rank alike: the
    Triton pieces where wanted, then torch.compile's fusion of the step's when asked (prefill
    chunks keep the Triton ones: a compiled piece would compile again for each new length)
    -> the load event's note on them (None where neither runs)."""
    wanted_here = wanted(device, step.cache.backends.fused_ops) and getattr(
        step, "fused_pieces", True)  # a family whose math the Triton pieces do not compute
    note = (enable(step) or NOTE) if wanted_here else None
    if compile_layers:
        step.fns = dict(step.eager_fns)
        compile_pieces(step, device)
        return None if note == NOTE else note
    return note


def enable(step) -> str | None:
    """Swap a FamilyStep's rms, add_rms, silu_mul and qkv_rope (its step's and its prefill
    chunks') for the Triton ones
    after comparing the two over one token and five: rows of its hidden size with its first
    layer's norm weight, an MLP input of its width, and its q/k/v written into probe caches.
    -> a note for the load event when they stay as they were, else None."""
    w = step.layers[0].ln_post
    hidden, device, dtype = w.shape[0], w.device, w.dtype
    width = _mlp_width(step)
    try:
        from engine.kernels import fused_ops_kernel as K

        g = torch.Generator(device="cpu").manual_seed(0)
        worst = 0.0  # the largest error over its tolerance
        for T in (1, 5):
            x, d = (torch.randn(1, T, hidden, generator=g).to(device, dtype) for _ in range(2))
            gu = torch.randn(1, T, 2 * width, generator=g).to(device, dtype)
            pairs = [(K.rms(x, w, step.eps), step.rms(x, w), TOLERANCE),
                     *((*p, TOLERANCE) for p in zip(K.add_rms(x, d, w, step.eps),
                                                    step.add_rms(x, d, w), strict=True)),
                     (K.silu_mul(gu), step.silu_mul(gu), TOLERANCE)]
            pairs += _rope_pairs(step, K, T, g, device, dtype)
            for got, want, tolerance in pairs:
                want = want.float()
                error = ((got.float() - want).norm() / want.norm()).item()
                worst = max(worst, error / tolerance)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a failed launch reports here
    except Exception as e:  # whatever broke, the PyTorch pieces still compute the same
        return (f"the fused decode-step kernels failed here ({type(e).__name__}: "
                f"{str(e)[:200]}); the step keeps PyTorch's pieces")
    if not worst < 1:  # (NaN included)
        return (f"the fused decode-step kernels disagreed with PyTorch's pieces here ({worst:.1f}"
                f" times the relative error allowed); the step keeps PyTorch's pieces")
    eps = step.eps
    step.fns.update(rms=lambda x, w: K.rms(x, w, eps),
                    add_rms=lambda x, delta, w: K.add_rms(x, delta, w, eps),
                    silu_mul=K.silu_mul,
                    qkv_rope=functools.partial(K.qkv_rope, num_heads=step.num_heads,
                                               num_kv_heads=step.num_kv_heads, eps=eps,
                                               rotation=step.cache.key_rotation))
    step.chunk_fns = dict(step.fns)
    return None


def _rope_pairs(step, K, T: int, g: torch.Generator, device: torch.device,
                dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """The q/k/v piece both ways over T tokens written into two probe caches of the step's KV
    dtype: (fused, PyTorch, tolerance) for q and for the K and V read back."""
    p, H, Hkv, D = step.layers[0], step.num_heads, step.num_kv_heads, step.head_dim
    caches = [KVCache(1, Hkv, D, PROBE_TOKENS, step.cache.kv_dtype, device) for _ in range(2)]
    for c in caches:
        c.reserve(PROBE_TOKENS)
    qkv = torch.randn(1, T, (H + 2 * Hkv) * D, generator=g).to(device, dtype)
    pos = torch.arange(PROBE_TOKENS - T - 3, PROBE_TOKENS - 3, device=device)
    args = (qkv, p.q_norm, p.k_norm, *step.cos_sin(pos, dtype), pos)
    fused = K.qkv_rope(*args, *caches[0].layer(0), num_heads=H, num_kv_heads=Hkv, eps=step.eps,
                       rotation=caches[0].key_rotation)
    plain = step.qkv_rope(*args, *caches[1].layer(0))
    read = [kv_arena.gather(*c.layer(0), PROBE_TOKENS, torch.float32) for c in caches]
    read_back = READ_BACK_TOLERANCE if caches[0].quantized else TOLERANCE
    return [(fused, plain, TOLERANCE), (read[0][0], read[1][0], read_back),
            (read[0][1], read[1][1], read_back)]


def _mlp_width(step) -> int:
    """The MLP's intermediate size (one rank's share under tensor parallelism): the down
    projection's input features."""
    down = step.layers[0].down
    if hasattr(down, "in_features"):  # nn.Linear, bitsandbytes' and the int4 layers
        return down.in_features
    weight = down if isinstance(down, torch.Tensor) else down.weight  # plain, or a module's
    return weight.shape[1]
