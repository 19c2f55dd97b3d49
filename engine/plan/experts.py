"""A mixture of experts in the plan: the fit holds every expert's bytes (in 4 bits under awq and
nf4, as the loader keeps them), but a decode step reads only the experts its token routes to
(top-k of the routed experts) besides attention, the router, the norms and the lm_head: the
bytes its memory roofline is over. Pure arithmetic, no torch (the app imports the planner)."""

from __future__ import annotations

from dataclasses import replace

from engine.formats import weights
from engine.formats.model_shape import ModelShape
from engine.plan.sizes import GiB, weight_bytes


def expert_bytes(shape: ModelShape, quant: str) -> int:
    """Every expert's weights in `quant` (0 for a dense model)."""
    if not shape.num_experts or not shape.expert_linears:  # dense, or experts not found apart
        return 0
    alone = replace(shape, linears=shape.expert_linears, embed_params=0, lm_head_params=0,
                    other_params=0)
    return weight_bytes(alone, quant)


def active_weight_bytes(shape: ModelShape, quant: str) -> int:
    """The weights one decode token reads: all of them but the experts it is not routed to
    (each expert the same size: k / E of the experts' bytes). The embedding table is in it, as
    in weights_bytes; the bench's roofline leaves its rows out (tools/bench/references.py)."""
    total, experts = weight_bytes(shape, quant), expert_bytes(shape, quant)
    if not experts:
        return total
    return total - experts + experts * shape.experts_per_token // shape.num_experts


def note(shape: ModelShape, quant: str) -> str | None:
    """The arithmetic, for the plan's notes (None for a dense model)."""
    experts = expert_bytes(shape, quant)
    if not experts:
        return None
    total, k, n = weight_bytes(shape, quant), shape.experts_per_token, shape.num_experts
    return (f"mixture of experts: the fit holds all {n} experts a layer ({experts / GiB:.2f} "
            f"GiB{_form(shape, quant)} of {total / GiB:.2f} GiB of weights); a decode token "
            f"reads {k} of them ({experts / GiB:.2f} x {k}/{n} = "
            f"{experts * k // n / GiB:.2f} GiB) and the rest ({(total - experts) / GiB:.2f} "
            f"GiB): {active_weight_bytes(shape, quant) / GiB:.2f} GiB a token, the decode "
            "roofline's weights")


def _form(shape: ModelShape, quant: str) -> str:
    """How the experts are kept under `quant`, where it is not the format's own word."""
    fmt = weights.get(quant)
    if not fmt.quantized:
        return ""
    groups = {weights.expert_group(quant, i) for _, i, _ in shape.expert_linears}
    if None in groups:
        return f" in 16 bits: {quant} keeps experts so" if not fmt.expert_groups else (
            f" in 16 bits: no {quant} group divides their widths")
    kept = "scale and offset" if fmt.expert_group_numbers == 2 else "scale"
    sizes = " or ".join(map(str, sorted(groups, reverse=True)))
    return f" in 4 bits, a 16-bit {kept} per {sizes} inputs"
