"""Models built on the meta device and given memory part by part on the target device, so a
model's 16-bit linear weights never all exist at once: the AWQ loader, and random 4-bit or 8-bit
models for benchmarks on an emulated small card (--memory-limit), which could not hold them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.files.model_folder import BadModel


def meta_model(config, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def random_fill(config, device: torch.device, dtype: torch.dtype,
                generator: torch.Generator) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """What a meta parameter gets in a random model: unit norms, zero biases, weights of the
    config's initializer range (values that decode without NaNs)."""
    std = getattr(config, "initializer_range", 0.02) or 0.02

    def fill(name: str, t: torch.Tensor) -> torch.Tensor:
        if "norm" in name and name.endswith("weight"):
            return torch.ones(t.shape, dtype=dtype, device=device)
        out = torch.empty(t.shape, dtype=dtype, device=device)
        return out.normal_(0, std, generator=generator) if name.endswith("weight") else out.zero_()

    return fill


def random_quantized_linears(model, device: torch.device, dtype: torch.dtype,
                             generator: torch.Generator, make_layer) -> None:
    """Each linear but the lm_head, still on meta: a random 16-bit weight made on the device and
    handed at once to `make_layer(weight [out, in], bias or None)`, which quantizes it."""
    head = model.get_output_embeddings()
    std = getattr(model.config, "initializer_range", 0.02) or 0.02
    for name, mod in list(model.named_modules()):
        if type(mod) is not torch.nn.Linear or mod is head:
            continue
        weight = torch.empty(mod.out_features, mod.in_features, dtype=dtype, device=device)
        weight.normal_(0, std, generator=generator)
        bias = (torch.zeros(mod.out_features, dtype=dtype, device=device)
                if mod.bias is not None else None)
        model.set_submodule(name, make_layer(weight, bias))
        del weight


def tie_and_materialize(model, device: torch.device,
                         missing: Callable[[str, torch.Tensor], torch.Tensor]) -> None:
    """Tie the lm_head where the config does, rebuild rotary tables (non-persistent buffers,
    computed from the config) on the device, and fill what is still on meta with `missing`."""
    tied = getattr(model.config.get_text_config(), "tie_word_embeddings", False)
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    for name, mod in list(model.named_modules()):
        if type(mod).__name__.endswith("RotaryEmbedding") and any(
                b.is_meta for b in mod.buffers()):
            with torch.device(device):  # (transformers 5.17 takes device=, 5.24 does not)
                model.set_submodule(name, type(mod)(mod.config))
    head_weight = next(n for n, m in model.named_modules() if m is head) + ".weight"
    for name, p in list(model.named_parameters(remove_duplicate=False)):
        if p.is_meta and not (tied and name == head_weight):
            owner_name, _, attr = name.rpartition(".")
            owner = model.get_submodule(owner_name)
            owner._parameters[attr] = torch.nn.Parameter(missing(name, p), requires_grad=False)
    if tied and head.weight.is_meta:  # after the embedding got its memory: share that
        head.weight = embed.weight
    leftover = [n for n, b in model.named_buffers() if b.is_meta]
    if leftover:
        raise BadModel(f"cannot build {', '.join(leftover)} for this architecture")
