"""The two references `hearth bench` measures beside the engine, in the same run: the memory
roofline (the card's copy bandwidth over the bytes one decode step must read) and plain
transformers `generate()` on the same model. Not the engine's own timing (bench.py)."""

from __future__ import annotations

import statistics
import time

import torch

from engine.events import BadRequest
from engine.formats import families


def copy_bandwidth(device: torch.device) -> float:
    """Bytes read + written per second by a large device-to-device copy (the roofline's rate)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 27)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    reps = 20 if device.type == "cuda" else 5
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    sync(device)
    rate = 2 * n * reps / (time.perf_counter() - t)
    del src, dst
    if device.type == "cuda":  # the probe's 2 GiB must not stay cached in the reported peak
        torch.cuda.empty_cache()
    return rate


def decode_bytes(model, kv_bytes_per_token: int, context: int) -> int:
    """What one decode step must read: every weight but the embedding table (the lm_head is
    read every step, also when tied to it), of a mixture of experts' only the top-k of the E
    experts a token routes to (the active bytes), plus the KV cache at `context`."""
    embed = model.get_input_embeddings().weight
    active = active_experts(model)
    total = sum(p.numel() * p.element_size() * active[0] // active[1] if ".experts." in name
                else p.numel() * p.element_size()
                for name, p in model.named_parameters() if p is not embed)
    for m in model.modules():  # bitsandbytes keeps 4-bit scales beside the packed weight
        state = getattr(getattr(m, "weight", None), "quant_state", None)
        if state is not None and getattr(state, "absmax", None) is not None:
            total += state.absmax.numel() * state.absmax.element_size()
    head = getattr(model.get_output_embeddings(), "weight", None)  # None: a quantized lm_head
    if head is embed:
        total += head.numel() * head.element_size()
    return total + kv_bytes_per_token * context


def active_experts(model) -> tuple[int, int]:
    """(experts a token reads, experts a layer) of a mixture of experts; (1, 1) for a dense
    model."""
    family = families.get(getattr(model.config, "model_type", None))
    spec = getattr(family, "experts", None)
    if spec is None:
        return 1, 1
    count = next(getattr(model.config, k) for k in spec.count_keys if hasattr(model.config, k))
    return getattr(model.config, spec.top_k_key), count


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so a host clock times it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_generate(model, ids: list[int], new_tokens: int, device) -> tuple[float, float]:
    """Plain transformers generate(), greedy, on the same model: (ttft_ms, decode tokens/s)."""
    from engine.attention import prefill as attention

    model.set_attn_implementation("sdpa")
    try:
        x = torch.tensor([ids], device=device)
        mask = torch.ones_like(x)

        def timed(n):
            sync(device)
            t = time.perf_counter()
            model.generate(x, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0)
            sync(device)
            return time.perf_counter() - t

        timed(2)  # warm-up
        # medians of three: single timings of a tiny model's few tokens once put the first
        # token after the whole answer (a negative rate) on a loaded 2-core machine
        t1 = statistics.median(timed(1) for _ in range(3))
        tn = statistics.median(timed(new_tokens) for _ in range(3))
        if tn <= t1:
            raise BadRequest("plain generate() could not be timed apart from its first token: "
                             "ask for more --new-tokens")
        return t1 * 1000, (new_tokens - 1) / (tn - t1)
    finally:
        model.set_attn_implementation(attention.ATTN_IMPLEMENTATION)
