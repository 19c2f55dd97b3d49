"""A mixture of experts loaded in 4 bits (--quant awq or nf4 on a 16-bit checkpoint): the
checkpoint read on the host (transformers stacks its per-expert tensors into [E, ...] ones),
then, layer by layer on the way to the device, each sparse layer's experts rounded to 4 bits
(quant/experts4.py) and every other linear but the lm_head as the format rounds dense layers:
AWQ's round-to-nearest into the engine's int4 layers (group 128, or the largest of 64 and 32
that divides), NF4 through bitsandbytes. The device never holds the 16-bit experts or linears
(the host does, for the time of the load); the router, norms and embeddings stay 16-bit.
"""

from __future__ import annotations

import torch

from engine.files.model_folder import BadModel, ModelFolder
from engine.formats import families
from engine.load import checkpoint_checks, language_model
from engine.load.awq_loader import is_awq
from engine.models import experts
from engine.quant import experts4


def rounds(folder: ModelFolder, quant: str) -> bool:
    """Whether this load rounds a mixture of experts' 16-bit checkpoint to `quant` here."""
    return _four_bit(folder.family, quant) and not is_awq(folder.config)


def sparse(config, quant: str) -> bool:
    """Whether a model of this transformers config keeps its experts in 4 bits under `quant`."""
    return _four_bit(getattr(config, "model_type", None), quant)


def _four_bit(model_type: str | None, quant: str) -> bool:
    family = families.get(model_type)
    return quant in experts4.FORMATS and family is not None and family.experts is not None


def load_model(folder: ModelFolder, device: torch.device, dtype: torch.dtype, quant: str,
               round_linears, forced: str | None = None) -> torch.nn.Module:
    """The checkpoint's model with 4-bit experts and linears on `device`: `round_linears(model,
    dtype, device, forced)` the format's loader's (load/weight_loaders.py; `forced`: the
    session's int4 kernel for AWQ's dense layers, where it fits)."""
    model, info = language_model.from_pretrained(
        folder.path, folder.architecture, dtype=dtype, use_safetensors=True,
        trust_remote_code=False, device_map={"": "cpu"})
    checkpoint_checks.refuse_missing_weights(model, info, folder)
    family = families.get(folder.family)
    try:
        for layer in model.get_submodule(family.names.layers):
            if experts.sparse(layer, family):
                old = layer.get_submodule(family.experts.experts)
                layer.set_submodule(family.experts.experts,
                                    experts4.Experts4.of(old, quant, dtype, device))
        round_linears(model, dtype, device, forced)
    except ValueError as e:  # a width no group divides: the checkpoint's shape, one sentence
        raise BadModel(str(e)) from None
    return model.to(device).eval()


def random_experts(model, quant: str, dtype: torch.dtype, device: torch.device,
                   g: torch.Generator) -> None:
    """A mixture's experts (its model built on the meta device, from config.json alone) made
    random 4-bit ones on `device` under awq or nf4: the speed runs' weights, no 16-bit copy."""
    if not sparse(model.config, quant):
        return
    family = families.get(model.config.model_type)
    for layer in model.get_submodule(family.names.layers):
        if experts.sparse(layer, family):
            old = layer.get_submodule(family.experts.experts)
            gate_up, down = (experts4.random(tuple(p.shape), quant, dtype, device, g)
                             for p in (old.gate_up_proj, old.down_proj))
            layer.set_submodule(family.experts.experts, experts4.Experts4(gate_up, down))
