"""Build a model whose linear layers are the engine's Int4Linear: from an AWQ checkpoint
(AutoAWQ GEMM layout, read from safetensors here: no gptqmodel, no compiler), or with random
4-bit weights from config.json alone (benchmarks).

The model is built on the meta device, each quantized linear is replaced by an Int4Linear made
on the target device in its kernel's layout (the conversion happens once, here), and only then
are the 16-bit parts (embeddings, norms, lm_head) given memory: the 16-bit weights of the
linear layers never exist, so a model loads on the card its 4-bit size fits.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

from engine.files.model_folder import BadModel, ModelFolder
from engine.load.meta_model import meta_model, random_fill, tie_and_materialize
from engine.quant import awq_format
from engine.quant.int4_linear import Int4Linear

QUANT_SUFFIXES = (".qweight", ".qzeros", ".scales")


def is_awq(config: dict) -> bool:
    qc = config.get("quantization_config")
    return isinstance(qc, dict) and str(qc.get("quant_method", "")).lower() == "awq"


def _meta_model(folder_path, dtype: torch.dtype):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder_path, trust_remote_code=False)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the engine replaces the linears itself, not transformers
    return meta_model(config, dtype)


def load_model(folder: ModelFolder, device: torch.device, dtype: torch.dtype,
               kernel: str | None = None, forced: str | None = None) -> torch.nn.Module:
    """The checkpoint's model with Int4Linear layers (`kernel`: int4_linear's choice if None,
    `forced` where it fits: a session's Backends.int4_kernel)."""
    from safetensors import safe_open

    try:
        awq_format.check_config(folder.config["quantization_config"])
    except ValueError as e:
        raise BadModel(str(e)) from None
    model = _meta_model(folder.path, dtype)
    with ExitStack() as stack:
        # a shard may end between a layer's qweight and its scales: look every name up by file
        where = {}
        for path in folder.weight_files:
            f = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            where.update(dict.fromkeys(f.keys(), f))
        get = lambda name: where[name].get_tensor(name)
        for prefix in sorted(n.removesuffix(".qweight") for n in where if n.endswith(".qweight")):
            missing = [prefix + s for s in QUANT_SUFFIXES if prefix + s not in where]
            if missing:
                raise BadModel(f"the AWQ checkpoint has {prefix}.qweight but no {missing[0]}")
            try:
                codes, zeros, scales = awq_format.unpack(
                    *(get(prefix + s).to(device) for s in QUANT_SUFFIXES))
            except ValueError as e:
                raise BadModel(f"{prefix} in the AWQ checkpoint: {e}") from None
            bias = get(prefix + ".bias") if prefix + ".bias" in where else None
            _replace_linear(model, prefix, Int4Linear.from_codes(
                codes, zeros, scales, bias, dtype, device, kernel, forced))
        for name in sorted(where):
            if not name.endswith(QUANT_SUFFIXES) and not _is_int4_bias(model, name):
                _assign(model, name, get(name), device, dtype)
    tie_and_materialize(model, device, missing=_missing)
    return model.eval()


def random_model(config, device: torch.device, dtype: torch.dtype, group_size: int = 128,
                 kernel: str | None = None, forced: str | None = None) -> torch.nn.Module:
    """A transformers config -> its model with random 4-bit linears (lm_head 16-bit), random
    embeddings and unit norms: real shapes for speed runs, values that decode without NaNs."""
    model = meta_model(config, dtype)
    head = model.get_output_embeddings()
    g = torch.Generator(device=device).manual_seed(0)
    for name, mod in list(model.named_modules()):
        if type(mod) is not torch.nn.Linear or mod is head:
            continue
        N, K = mod.out_features, mod.in_features
        if K % group_size:
            raise BadModel(f"{name} has {K} input features, not a multiple of the AWQ group size "
                           f"{group_size}")
        codes = torch.randint(0, 16, (N, K), generator=g, device=device, dtype=torch.uint8)
        zeros = torch.full((K // group_size, N), 8, dtype=torch.uint8, device=device)
        # (q - 8) has std ~4.6: weights of std ~0.02, the usual initializer range
        scales = torch.rand(K // group_size, N, generator=g, device=device) * 0.002 + 0.0034
        bias = (torch.randn(N, generator=g, device=device) * 0.02 if mod.bias is not None
                else None)
        _replace_linear(model, name, Int4Linear.from_codes(codes, zeros, scales, bias, dtype,
                                                           device, kernel, forced))
    from engine.load import experts_quant  # (it imports this module)

    experts_quant.random_experts(model, "awq", dtype, device, g)
    tie_and_materialize(model, device, missing=random_fill(config, device, dtype, g))
    return model.eval()


def _replace_linear(model, name: str, new: Int4Linear) -> None:
    try:
        old = model.get_submodule(name)
    except AttributeError:
        raise BadModel(f"the checkpoint quantizes {name}, which this architecture does not "
                       "have") from None
    if not isinstance(old, torch.nn.Linear) or (old.out_features, old.in_features) != (
            new.out_features, new.in_features):
        raise BadModel(f"{name} in the checkpoint is {new.in_features}x{new.out_features}; the "
                       f"model expects {old}")
    model.set_submodule(name, new)


def _is_int4_bias(model, name: str) -> bool:
    owner, _, attr = name.rpartition(".")
    return attr == "bias" and isinstance(_find(model, owner), Int4Linear)


def _find(model, name: str):
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _assign(model, name: str, tensor: torch.Tensor, device, dtype) -> None:
    """A 16-bit tensor of the checkpoint into the meta model (cast to the compute dtype)."""
    owner_name, _, attr = name.rpartition(".")
    owner = _find(model, owner_name)
    if owner is None or attr not in owner._parameters:
        return  # e.g. an old checkpoint's rotary_emb.inv_freq: rebuilt from the config instead
    old = owner._parameters[attr]
    if tuple(old.shape) != tuple(tensor.shape):
        raise BadModel(f"{name} in the checkpoint is {tuple(tensor.shape)}; the model expects "
                       f"{tuple(old.shape)}")
    value = tensor.to(device, dtype if tensor.is_floating_point() else tensor.dtype)
    owner._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)


def _missing(name: str, t: torch.Tensor) -> torch.Tensor:
    raise BadModel(f"the checkpoint has no tensor for {name}")

