"""Swap a model's plain linear layers for bitsandbytes NF4 / INT8 ones, in place.

For models built in memory (random-weight benchmarks); checkpoints on disk are quantized by
transformers' loader with a BitsAndBytesConfig instead. The lm_head stays 16-bit, as there.
"""

from __future__ import annotations

import torch


def quantize_linears(model: torch.nn.Module, quant: str, compute_dtype: torch.dtype,
                     device: torch.device | None = None) -> None:
    """`device`: where the quantized layers go (default: where each layer is). A model built on
    the CPU is quantized one matrix at a time on its way to the GPU, so its 16-bit weights never
    all sit on the card (a 7B model's 15 GB would not fit the 8 GiB card NF4 is for)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child is model.get_output_embeddings():
                continue
            dest = device or child.weight.device
            bias = child.bias.data if child.bias is not None else None
            new = bnb_linear(child.weight.data, bias, quant, compute_dtype, dest)
            del child
            setattr(parent, name, new)


def bnb_linear(weight: torch.Tensor, bias: torch.Tensor | None, quant: str,
               compute_dtype: torch.dtype, dest: torch.device) -> torch.nn.Module:
    """weight [out, in] (anywhere) -> a bitsandbytes NF4 or INT8 layer on `dest`, quantized on the
    way there."""
    import bitsandbytes as bnb

    out_features, in_features = weight.shape
    if quant == "nf4":  # Params4bit quantizes when moved to its device
        new = bnb.nn.Linear4bit(in_features, out_features, bias=bias is not None,
                                compute_dtype=compute_dtype, quant_type="nf4",
                                compress_statistics=True, device="meta")
        new.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4",
                                       compress_statistics=True)
    else:
        if dest.type != "cuda":
            raise ValueError("INT8 quantization in memory needs a CUDA device")
        new = bnb.nn.Linear8bitLt(in_features, out_features, bias=bias is not None,
                                  has_fp16_weights=False, threshold=6.0, device="meta")
        # Int8Params quantizes on a CPU->GPU move
        new.weight = bnb.nn.Int8Params(weight.to("cpu"), requires_grad=False,
                                       has_fp16_weights=False)
    if bias is not None:
        new.bias = torch.nn.Parameter(bias, requires_grad=False)
    return new.to(dest)
