"""The family step for a mixture of experts (Qwen3-MoE, Mixtral): the family step's attention
and norms unchanged, and each layer's MLP the grouped expert product of the tokens of every row
of the pass (models/experts.py): a batch's rows routed to different experts are grouped by
expert, each expert's weights read once for all its tokens."""

from __future__ import annotations

import torch

from engine.models.experts import ExpertMLP, check_kernel
from engine.models.layers import FamilyStep


class MoeStep(FamilyStep):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the load event's note where the grouped kernel is not used after all
        self.kernel_note = check_kernel([p.gate_up for p in self.layers
                                         if isinstance(p.gate_up, ExpertMLP)])

    def _mlp_in(self, h: torch.Tensor, w, f: dict) -> torch.Tensor:
        # the experts' weighted sum, down included: the layer's down (experts.Summed) passes it
        return w(h) if isinstance(w, ExpertMLP) else super()._mlp_in(h, w, f)

    def make_reproducible(self, tiles, bucket) -> None:
        # its tiles are calibrated on dense products; an expert's rows change with the batch
        raise RuntimeError("the reproducible mode does not cover mixtures of experts")
