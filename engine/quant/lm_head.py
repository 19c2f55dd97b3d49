"""The optional quantized lm_head (`--lm-head int8|int4`), for any weight format.

Besides the decoder layers, a decode step reads the whole lm_head: for Qwen2.5-7B in AWQ its
16-bit copy is 1.09 GB of the ~4.8 GB a step reads, so 8 bits save ~11% of the step's bytes and
4 bits ~17%. Off by default: rounding the logits' matrix costs quality (docs/benchmark-log.md
measures how much). A tied embedding keeps its 16-bit table; the quantized copy is the
lm_head's own.
"""

from __future__ import annotations

import torch

from engine.events import BadRequest
from engine.quant.int4_linear import Int4Linear
from engine.quant.int8_linear import Int8Linear


def quantize_lm_head(model, how: str, device: torch.device, dtype: torch.dtype) -> str:
    """Swap the lm_head for an Int8Linear / Int4Linear (round-to-nearest) -> a note for the
    load events."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise BadRequest(f"this model's lm_head is a {type(head).__name__}; --lm-head {how} "
                         "quantizes a plain linear one")
    K = head.in_features
    if how == "int8":
        new = Int8Linear.quantize(head.weight.data, head.bias, dtype, device)
    else:
        group = next((g for g in (128, 64, 32) if K % g == 0), None)
        if group is None:
            raise BadRequest(f"--lm-head int4 groups inputs by 32 to 128; hidden size {K} does "
                             "not split so")
        new = Int4Linear.quantize(head.weight.data, head.bias, group, dtype, device)
    model.set_output_embeddings(new)
    # untied from here on: nothing may re-tie a 16-bit weight onto the quantized module
    model.config.get_text_config().tie_word_embeddings = False
    nbytes = sum(p.numel() * p.element_size() for p in new.parameters())
    note = f"lm_head: {how} ({new.kernel} kernel, {nbytes / 2**20:.1f} MiB)"
    if how == "int8" and device.type == "cuda":  # measured: docs/benchmark-log.md (AWQ weights)
        note += ("; torch's int8 kernel is slow at batch 1 on CUDA (the benchmark GPU decoded a 7B "
                 "in AWQ at 171 tokens/s with it, 270 with the 16-bit lm_head, 277 with int4)")
    return note
