"""AWQ for the families that allow it (formats/families names their modules and scale groups),
layer by layer, written out in AutoAWQ's GEMM format (what transformers + gptqmodel load, and
load/awq_loader.py too).

For each decoder layer, on the device: run the calibration tokens through it (full precision)
while hooks record what each group of linear layers reads; search and fold the scales
(tools/awq_search.py) into the op before each group; search clip bounds; round to 4 bits with a zero
point per group of inputs (32, 64 or 128: tools/quantize.py chooses). The next layer reads the
full-precision outputs, as in AutoAWQ. Only one layer sits on the device at a time, so a GPU
quantizes models larger than its memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.formats import families
from engine.formats.model_shape import AWQ_GROUP
from engine.quant import awq_format
from engine.tools import awq_search

SEARCH_TOKENS = 4096  # tokens per group of linears the scale search measures its outputs on
CHUNK_TOKENS = 8192  # tokens per layer forward: bounds the activations on the device


@dataclass(frozen=True)
class Group:
    """Linear layers that read one input, and the op before them that the scales fold into."""

    prev: str  # an RMSNorm (weight /= s) or a linear (its output rows /= s)
    linears: tuple[str, ...]


def groups(names: families.ModuleNames) -> tuple[Group, ...]:
    """The family's scale groups (v -> o only without GQA: _foldable checks the shapes)."""
    return tuple(Group(prev, linears) for prev, linears in names.awq_groups)


class _Stop(Exception):
    pass


class _InputStats:
    """What one linear layer reads: the mean |x| per channel, and every `stride`-th token."""

    def __init__(self, stride: int):
        self.stride, self.abs_sum, self.count, self.rows = stride, None, 0, []

    def __call__(self, module, args, output) -> None:
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float()  # [tokens, K]
        s = x.abs().sum(0)
        self.abs_sum = s if self.abs_sum is None else self.abs_sum + s
        self.count += x.shape[0]
        self.rows.append(x[:: self.stride])

    def mean(self) -> torch.Tensor:
        return self.abs_sum / self.count

    def sample(self) -> torch.Tensor:
        return torch.cat(self.rows)


def _layer_inputs(model, names: families.ModuleNames, blocks: torch.Tensor, device: torch.device,
                  chunk: int):
    """Run the embeddings only, per chunk of blocks [n, T] -> [(hidden [c, T, H] on device,
    the kwargs transformers passes its decoder layers)]."""
    first = model.get_submodule(names.layers)[0]
    embed, rotary = model.get_submodule(names.embed), model.get_submodule(names.rotary)
    seen = []

    def catch(module, args, kwargs):
        seen.append((args[0] if args else kwargs.pop("hidden_states"), kwargs))
        raise _Stop

    hook = first.register_forward_pre_hook(catch, with_kwargs=True)
    embed.to(device)
    rotary.to(device)
    try:
        for lo in range(0, blocks.shape[0], chunk):
            try:
                model(input_ids=blocks[lo:lo + chunk].to(device), use_cache=False)
            except _Stop:
                pass
    finally:
        hook.remove()
        embed.to("cpu")
    return seen


def _fold(layer, group: Group, s: torch.Tensor) -> None:
    """x' = x / s into the op before, W' = W diag(s) into the linears: the same function."""
    prev = layer.get_submodule(group.prev)
    if isinstance(prev, torch.nn.Linear):  # its output rows feed our inputs channel for channel
        prev.weight.data.div_(s.to(prev.weight.dtype)[:, None])
        if prev.bias is not None:
            prev.bias.data.div_(s.to(prev.bias.dtype))
    else:  # RMSNorm: y = w * norm(x)
        prev.weight.data.div_(s.to(prev.weight.dtype))
    for name in group.linears:
        lin = layer.get_submodule(name)
        lin.weight.data.mul_(s.to(lin.weight.dtype)[None, :])


def _foldable(layer, group: Group) -> bool:
    prev = layer.get_submodule(group.prev)
    first = layer.get_submodule(group.linears[0])
    return not isinstance(prev, torch.nn.Linear) or prev.out_features == first.in_features


def _search(layer, scale_groups: tuple[Group, ...], inputs, stride: int, group_size: int):
    """One layer's AWQ search -> (the next layer's inputs, {linear: its inputs after scaling},
    the chosen scale exponent per group, -1 for none)."""
    stats = {g.linears[0]: _InputStats(stride) for g in scale_groups}
    hooks = [layer.get_submodule(n).register_forward_hook(st) for n, st in stats.items()]
    try:  # the full-precision outputs: the next layer's inputs
        nxt = [(_hidden(layer(x, **kw)), kw) for x, kw in inputs]
    finally:
        for h in hooks:
            h.remove()
    # scales first, all of them (folding into up_proj changes what gate/up round), then clip
    # and round each linear: AutoAWQ's order
    ratios, inputs_of = [], {}
    for g in scale_groups:
        st = stats[g.linears[0]]
        x = st.sample()
        if _foldable(layer, g):
            ws = [layer.get_submodule(n).weight for n in g.linears]
            s, ratio = awq_search.search_scale(st.mean(), x, ws, group_size)
            _fold(layer, g, s)
            x = x / s
            ratios.append(ratio)
        inputs_of.update(dict.fromkeys(g.linears, x))
    return nxt, inputs_of, ratios


@torch.no_grad()
def quantize_model(model, blocks: torch.Tensor | None, device: torch.device,
                   progress: Callable[[int, int, str], None] = lambda done, total, msg: None,
                   group_size: int = AWQ_GROUP) -> dict[str, torch.Tensor]:
    """model: a transformers model of an AWQ family on the CPU (its weights are changed in place:
    scales folded, clipped); blocks: [n, T] calibration tokens, or None for plain round-to-nearest
    (the baseline AWQ is measured against) -> the checkpoint's tensors (AWQ format: qweight/
    qzeros/scales per linear, everything else fp16)."""
    names = families.get(model.config.model_type).names
    scale_groups = groups(names)
    no_clip = (names.q, names.k)  # their error passes through the softmax: AutoAWQ leaves them
    layers = model.get_submodule(names.layers)
    inputs = stride = None
    if blocks is not None:
        stride = max(1, blocks.numel() // SEARCH_TOKENS)
        inputs = _layer_inputs(model, names, blocks, device,
                               max(1, CHUNK_TOKENS // blocks.shape[1]))
    out: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(layers):
        t0 = time.perf_counter()
        layer.to(device)
        if inputs is None:
            inputs_of, what = dict.fromkeys(n for g in scale_groups for n in g.linears), "rounded"
        else:
            inputs, inputs_of, ratios = _search(layer, scale_groups, inputs, stride, group_size)
            what = "scale exponents " + ", ".join("none" if r < 0 else f"{r:.2f}" for r in ratios)
        for name, x in inputs_of.items():
            lin = layer.get_submodule(name)
            clip = None if x is None or name.endswith(no_clip) else awq_search.search_clip(
                x, lin.weight, group_size)
            codes, zeros, scales = awq_format.quantize(lin.weight, group_size, clip)
            prefix = f"{names.layers}.{i}.{name}"
            for key, t in awq_format.pack(codes, zeros, scales).items():
                out[f"{prefix}.{key}"] = t.cpu()
            if lin.bias is not None:
                out[f"{prefix}.bias"] = lin.bias.to("cpu", torch.float16)
            lin.weight = None  # done with: the 16-bit copy leaves memory
        layer.to("cpu")
        progress(i + 1, len(layers), f"layer {i + 1}/{len(layers)}: {what} "
                 f"({time.perf_counter() - t0:.1f} s)")
    for name, t in model.state_dict().items():
        owner = name.rpartition(".")[0]
        if name.startswith(f"{names.layers}.") and (f"{owner}.qweight" in out or name in out):
            continue
        if (name == f"{names.lm_head}.weight"
                and model.config.get_text_config().tie_word_embeddings):
            continue  # tied: the embedding is the one copy (safetensors stores no aliases)
        out[name] = t.to(torch.float16) if t.is_floating_point() else t
    return out


def _hidden(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output
