"""Forward passes over the engine's cache: a prefill chunk and the one-token decode step.

transformers supplies the model's modules; this file owns what a step reads and writes. The
model is called with no transformers cache and the engine's StepContext (attention.py).
"""

from __future__ import annotations

import torch

from engine.attention import StepContext
from engine.kv_cache import KVCache

PREFILL_CHUNK = 512  # bounds activation memory for long prompts


class Decoder:
    def __init__(self, model: torch.nn.Module, cache: KVCache, device: torch.device):
        self.model = model
        self.cache = cache
        self.device = device

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """ids: [T] int64 at positions start..start+T-1 -> logits of the last one, [V]."""
        end = start + ids.numel()
        positions = torch.arange(start, end, device=self.device)
        out = self.model(input_ids=ids[None], position_ids=positions[None], use_cache=False,
                         logits_to_keep=1, hearth_step=StepContext(self.cache, positions, start,
                                                                   end))
        return out.logits[0, -1]

    def step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """token: [1] int64 on the device, fed at `position` -> logits [V]."""
        logits = self.forward(token, position)
        return logits
