"""Each weight format's loader, named by formats/weights.py: a checkpoint, or random weights from
config.json alone, made a model in the format; a 16-bit model's linears rounded to it (a
mixture's, after its experts: load/experts_quant.py); the engine's layers swapped in after."""

from __future__ import annotations

import importlib

import torch

from engine.config.backends import Backends
from engine.formats import weights
from engine.load import awq_loader, checkpoint_checks, experts_quant, language_model
from engine.load.meta_model import (
    meta_model,
    random_fill,
    random_quantized_linears,
    tie_and_materialize,
)
from engine.platform import library_noise
from engine.quant import experts4
from engine.quant.bnb import bnb_linear, quantize_linears
from engine.quant.int4_linear import Int4Linear, choose_kernel


def of(quant: str) -> Floats:
    """The loader formats/weights.py names for `quant` ("module:attribute")."""
    module, _, attr = weights.get(quant).loader.partition(":")
    return getattr(importlib.import_module(module), attr)


class Floats:
    """bf16 / fp16 / fp32: transformers reads the checkpoint as it is, in the compute dtype."""

    def holds(self, config: dict) -> bool:
        """Whether a checkpoint of this config.json holds its weights in this format already."""
        return False

    def quantization_config(self, dtype: torch.dtype):
        return None

    def load(self, folder, device: torch.device, dtype: torch.dtype, forced: str | None = None):
        with library_noise.quiet_load_report():
            model, info = language_model.from_pretrained(
                folder.path, folder.architecture, dtype=dtype, use_safetensors=True,
                trust_remote_code=False, device_map={"": device},
                quantization_config=self.quantization_config(dtype))
        checkpoint_checks.refuse_missing_weights(model, info, folder)
        return model.eval()

    def random(self, config, architecture: str, device: torch.device, dtype: torch.dtype,
               forced: str | None = None, small_card: bool = False):
        """`small_card`: an emulated card (--memory-limit) that 16-bit weights may not fit."""
        with torch.device(device):
            return language_model.from_config(config, architecture, dtype=dtype).eval()

    def round_linears(self, model, dtype: torch.dtype, device: torch.device | None,
                      forced: str | None = None) -> None:
        """A 16-bit model's linears but the lm_head in this format, in place (on `device`, or
        where each is): a float format keeps them."""

    def own(self, model, device: torch.device, backends: Backends) -> None:
        """After a load: every int4 layer's prefill products as the session's int4_prefill says."""
        if backends.int4_prefill != "fused":
            for m in model.modules():
                if isinstance(m, Int4Linear):
                    m.fused_prefill = False


class Bitsandbytes(Floats):
    """bitsandbytes' layers of kind `quant` (quant/bnb.py), made by transformers' load."""

    def __init__(self, quant: str):
        self.quant = quant

    def quantization_config(self, dtype: torch.dtype):
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(load_in_8bit=True)

    def random(self, config, architecture: str, device: torch.device, dtype: torch.dtype,
               forced: str | None = None, small_card: bool = False):
        if small_card or experts_quant.sparse(config, self.quant):
            # an emulated small card cannot hold the 16-bit weights (nor a card a mixture's
            # 16-bit experts): built on meta, each linear and expert made on the card in its format
            return self.on_meta(config, device, dtype)
        model = super().random(config, architecture, device, dtype)
        self.round_linears(model, dtype, None)
        return model

    def round_linears(self, model, dtype: torch.dtype, device: torch.device | None,
                      forced: str | None = None) -> None:
        quantize_linears(model, self.quant, dtype, device)

    def on_meta(self, config, device: torch.device, dtype: torch.dtype, make_layer=None):
        """`make_layer(weight, bias)`: bitsandbytes' layer unless a test gives another."""
        if make_layer is None:
            make_layer = lambda w, b: bnb_linear(w, b, self.quant, dtype, device)  # noqa: E731
        model = meta_model(config, dtype)
        g = torch.Generator(device=device).manual_seed(0)
        random_quantized_linears(model, device, dtype, g, make_layer)
        experts_quant.random_experts(model, self.quant, dtype, device, g)
        tie_and_materialize(model, device, missing=random_fill(config, device, dtype, g))
        return model.eval()


class Nf4(Bitsandbytes):
    def quantization_config(self, dtype: torch.dtype):
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=weights.NF4_DOUBLE_QUANT, bnb_4bit_compute_dtype=dtype)

    def own(self, model, device: torch.device, backends: Backends) -> None:
        """bitsandbytes' NF4 layers on a GPU swapped for the engine's (quant/nf4_linear.py: the
        same codes, run by the int4 kernels' codebook variant, faster than bitsandbytes' layers:
        BENCHMARKS.md); a session's int4 kernel other than "mma" keeps bitsandbytes' layers."""
        if device.type == "cuda" and backends.int4_kernel in (None, "mma"):
            from engine.quant import nf4_linear

            nf4_linear.convert(model)
        super().own(model, device, backends)


class Awq(Floats):
    """The engine's int4 layers (quant/int4_linear.py) from an AWQ checkpoint (load/awq_loader.py),
    or a 16-bit mixture's linears rounded to nearest."""

    def holds(self, config: dict) -> bool:
        return awq_loader.is_awq(config)

    def load(self, folder, device: torch.device, dtype: torch.dtype, forced: str | None = None):
        return awq_loader.load_model(folder, device, dtype, forced=forced)

    def random(self, config, architecture: str, device: torch.device, dtype: torch.dtype,
               forced: str | None = None, small_card: bool = False):
        return awq_loader.random_model(config, device, dtype, forced=forced)

    def round_linears(self, model, dtype: torch.dtype, device: torch.device | None,
                      forced: str | None = None) -> None:
        head = model.get_output_embeddings()
        for name, mod in list(model.named_modules()):
            if type(mod) is not torch.nn.Linear or mod is head:
                continue
            group = experts4.group_size("awq", mod.in_features)
            bias = None if mod.bias is None else mod.bias.data
            dest = device or mod.weight.device
            kernel = choose_kernel(dest, dtype, mod.out_features, mod.in_features, group, forced)
            new = Int4Linear.quantize(mod.weight.data, bias, group, dtype, dest, kernel)
            model.set_submodule(name, new)


FLOATS, INT8, NF4, AWQ = Floats(), Bitsandbytes("int8"), Nf4("nf4"), Awq()
