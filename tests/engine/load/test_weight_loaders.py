"""Every weight format of the registry (formats/weights.py) names a loader and a byte count, and
the planner's bytes for a model in a format are the bytes its loader makes: the tensors each
layer holds after a load, bitsandbytes' quantization state included (its absmax, codes and
LLM.int8's row scales are attributes of the weight, not parameters)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.events import LoadRequest
from engine.files.model_folder import check
from engine.formats import weights
from engine.formats.model_shape import ModelShape
from engine.load import loader, weight_loaders
from engine.plan.sizes import weight_bytes

CPU = torch.device("cpu")


def _side_tensors(weight) -> list[torch.Tensor]:
    """bitsandbytes' state beside a quantized weight: NF4's absmax, code and (double quant) the
    absmax's own; LLM.int8's scale per output row."""
    state = getattr(weight, "quant_state", None)
    if state is not None:
        nested = [state.offset, state.state2.absmax, state.state2.code] if state.nested else []
        return [state.absmax, state.code, *nested]
    scb = getattr(weight, "SCB", None)
    return [] if scb is None else [scb]


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter (a tied one once) and of the state each layer keeps beside it."""
    params = list(model.parameters())  # tied parameters once
    tensors = params + [t for p in params for t in _side_tensors(p)]
    return sum(t.numel() * t.element_size() for t in tensors)


def test_every_format_names_a_loader_and_a_byte_count():
    for name in weights.names():
        fmt = weights.get(name)
        assert isinstance(weight_loaders.of(name), weight_loaders.Floats), name
        if fmt.quantized:  # a 128 x 128 linear: fewer bytes than 16 bits, more than its bits
            size = fmt.linear_bytes(128, 128, None, None)
            assert 128 * 128 * fmt.bits // 8 < size < 128 * 128 * 2, name
        else:
            assert fmt.bits in (16, 32) and fmt.linear_bytes is None, name


@pytest.mark.parametrize("arch", ["qwen2", "llama"])  # biases and tied embeddings; neither
@pytest.mark.parametrize("quant", weights.names())
def test_the_planner_counts_the_bytes_each_loader_makes(quant, arch, tiny_awq):
    folders = tiny_awq[arch]  # AWQ-sized (hidden 128): every format's groups divide it
    folder = check(str(folders["awq" if quant == "awq" else "source"]))
    fmt = weights.get(quant)
    dtype = torch.bfloat16 if fmt.quantized else getattr(torch, fmt.torch_dtype)
    model = weight_loaders.of(quant).load(folder, CPU, dtype)
    shape = ModelShape.from_folder(folder.path)
    planned = weight_bytes(shape, quant, shape.double_quant if quant == shape.quant_method
                           else None)
    assert held_bytes(model) == planned


@pytest.fixture
def rows_format():
    """A format registered from a test: LLM.int8's loader under another name, its bytes those of
    a layer that kept an fp32 scale per output row and per input column."""
    fmt = weights.register(dataclasses.replace(
        weights.get("int8"), name="int8-rows",
        linear_bytes=lambda out, inp, group, dq: out * inp + 4 * out + 4 * inp))
    yield fmt
    weights.unregister(fmt.name)


def test_a_new_format_is_one_entry(rows_format, tiny_model):
    """The loader loads it with the loader its entry names, and the planner counts its entry's
    bytes: neither compares its name with anything."""
    lm = loader.load(check(str(tiny_model)), LoadRequest(str(tiny_model), quant="int8-rows",
                                                         device="cpu"), progress=lambda p: None)
    assert lm.quant == "int8-rows"
    assert {type(m).__name__ for m in lm.model.modules()} >= {"Linear8bitLt"}
    shape = ModelShape.from_folder(tiny_model)
    columns = sum(4 * i * n for _, i, n in shape.linears)
    assert weight_bytes(shape, "int8-rows") - columns == held_bytes(lm.model) \
        == weight_bytes(shape, "int8")
