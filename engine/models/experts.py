"""A mixture of experts' layer as the family step reads it (formats/families: Family.experts):
the router's weight, the experts' fused [gate; up] and down (16-bit, or 4-bit: Packed4), the
top-k and its renormalisation, and which grouped product runs (kernels/experts: Triton on a GPU,
the PyTorch reference elsewhere). No shared experts: the two families on the step have none."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.formats.families import Family
from engine.kernels.attention_backend import triton_available
from engine.kernels.experts import grouped
from engine.quant.experts4 import Experts4

TOLERANCE = 2e-2  # relative: 16-bit operands in either order of the sums


class ExpertMLP:
    """h [1, T, hidden] -> the layer's MLP output [1, T, hidden]: each token through its top-k
    experts, weighted and summed (kernels/experts/grouped.py)."""

    def __init__(self, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                 top_k: int, normalize: bool):
        self.router, self.gate_up, self.down = router, gate_up, down
        self.top_k, self.normalize = top_k, normalize
        on_gpu = gate_up.device.type == "cuda" and triton_available()
        self.kernel = "triton" if on_gpu else "reference"

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> each token's experts [T, k] and weights [T, k]."""
        return grouped.route(F.linear(x, self.router), self.top_k, self.normalize)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        x = h.reshape(-1, h.shape[-1])
        ids, weights = self.route(x)
        return grouped.product(x, self.gate_up, self.down, ids, weights,
                               self.kernel).view_as(h)


def check_kernel(layers: list[ExpertMLP]) -> str | None:
    """Where the layers take the Triton product: it against the reference over a few tokens
    of the first layer's own weights, once at load. Where it fails or disagrees, every layer
    keeps the reference -> a note for the load event saying so (None: nothing to say)."""
    first = layers[0] if layers else None
    if first is None or first.kernel != "triton":
        return None
    why = None
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(5, first.router.shape[1], generator=g).to(first.router)
        ids, weights = first.route(x)
        got, want = (grouped.product(x, first.gate_up, first.down, ids, weights, k).float()
                     for k in ("triton", "reference"))
        error = ((got - want).norm() / want.norm()).item()
        if not error < TOLERANCE:  # (NaN included)
            why = f"it disagreed with the PyTorch reference (relative error {error:.2g})"
    except Exception as e:  # whatever broke, the reference still computes the same
        why = f"it failed here ({type(e).__name__}: {str(e)[:200]})"
    if why is None:
        return None
    for layer in layers:
        layer.kernel = "reference"
    return f"the grouped expert kernel is off: {why}; the experts run PyTorch's reference"


class Summed(torch.nn.Module):
    """The layer's down projection where experts replace the MLP: the grouped product has run
    each expert's down already, so the step's down passes its input through. `in_features` is
    the width the step's fused pieces are probed with (models/fused_ops.py)."""

    def __init__(self, width: int):
        super().__init__()
        self.in_features = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def sparse(layer, family: Family) -> bool:
    """Every piece of the layer's MLP is the experts the step reads: a router of top-k and
    SiLU-gated experts in transformers 5's fused layout, or those rounded to 4 bits at load
    (quant/experts4.py); not a dense MLP between sparse ones, as Qwen3-MoE's mlp_only_layers
    make."""
    spec = family.experts
    try:
        router, experts = layer.get_submodule(spec.router), layer.get_submodule(spec.experts)
    except AttributeError:
        return False
    if not (isinstance(getattr(router, "weight", None), torch.Tensor)
            and getattr(router, "bias", None) is None):
        return False
    return isinstance(experts, Experts4) or (
        all(isinstance(getattr(experts, n, None), torch.Tensor)
            for n in ("gate_up_proj", "down_proj"))
        and getattr(experts, "gate_up_proj_bias", None) is None
        and getattr(experts.act_fn, "__class__", type(None)).__name__ == "SiLUActivation")


def of(layer, family: Family, config) -> tuple[ExpertMLP, Summed]:
    """One sparse layer's experts, in place of (gate_up, down)."""
    spec = family.experts
    router, experts = layer.get_submodule(spec.router), layer.get_submodule(spec.experts)
    normalize = spec.normalize == "always" or bool(getattr(config, spec.normalize, False))
    mlp = ExpertMLP(router.weight, experts.gate_up_proj, experts.down_proj,
                    getattr(config, spec.top_k_key), normalize)
    return mlp, Summed(router.weight.shape[1])
