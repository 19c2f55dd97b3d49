"""`hearth quantize --method awq`: an AWQ copy of a bf16/fp16 model folder, written in AutoAWQ's
GEMM format so that plain transformers + gptqmodel load it as well as Hearth does. `--method rtn`
writes plain round-to-nearest 4-bit weights in the same format: the baseline AWQ improves on.

Checks everything it can before importing torch (exit 2, one sentence); on a GPU one decoder
layer at a time goes to the card; on the CPU it is meant for small models (minutes for 0.5B).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from engine.events import BadRequest
from engine.formats import families
from engine.formats.model_shape import AWQ_GROUP

METHODS = ("awq", "rtn")
EXIT_OK, EXIT_BAD_INPUT = 0, 2
NUM_SAMPLES, SEQ_LEN = 128, 512  # AutoAWQ's defaults: 64K calibration tokens
SHARD_BYTES = 4 << 30
SKIP_FILES = ("config.json", "model.safetensors.index.json")


GROUP_SIZES = (128, 64, 32)  # what the int4 kernels take; the largest that fits is the default


def group_size_for(config: dict, asked: int | None = None) -> int:
    """The AWQ group: `asked`, or the largest of GROUP_SIZES that divides every linear's input
    features (hidden size, attention width, intermediate size: SmolLM2-135M's 576 takes 64)."""
    widths = {config.get("hidden_size", 0), config.get("intermediate_size", 0)}
    heads, head_dim = config.get("num_attention_heads"), config.get("head_dim")
    if heads and head_dim:
        widths.add(heads * head_dim)
    fits = [g for g in GROUP_SIZES if all(w and not w % g for w in widths)]
    if asked is not None:
        if asked not in GROUP_SIZES:
            raise BadRequest(f"--group-size takes {', '.join(map(str, GROUP_SIZES))}, "
                             f"not {asked}")
        if asked not in fits:
            raise BadRequest(f"--group-size {asked} does not divide the model's widths "
                             f"({', '.join(map(str, sorted(widths)))})"
                             + (f"; {fits[0]} does" if fits else ""))
        return asked
    if not fits:
        raise BadRequest(f"AWQ groups input features by 32, 64 or 128; the model's widths "
                         f"({', '.join(map(str, sorted(widths)))}) are multiples of none")
    return fits[0]


def check_model(config: dict, group_size: int | None = None) -> int:
    """What the AWQ quantizer takes: a family that allows it, dimensions in whole groups ->
    the group size."""
    if config.get("quantization_config"):
        raise BadRequest("the model is already quantized; AWQ starts from 16-bit weights")
    family = families.get(config.get("model_type"))
    if family is None or not family.awq:
        raise BadRequest(f"`hearth quantize --method awq` covers "
                         f"{families.listing(families.awq_types())} models, not "
                         f"{config.get('model_type')}")
    return group_size_for(config, group_size)


def _check(model: str | None, out: str, calibration: str | None, device: str,
           needs_text: bool = True, group_size: int | None = None):
    from engine.files.model_folder import check
    from engine.tools import calibration as calib

    folder = check(model)
    group = check_model(folder.config, group_size)
    dest = Path(out).expanduser()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BadRequest(f"--out {out} exists and is not an empty folder")
    if dest.resolve() == folder.path.resolve():
        raise BadRequest("--out must be a new folder, not the model's own")
    if device not in ("auto", "cuda", "cpu"):
        raise BadRequest(f"unknown --device {device!r}; choose auto, cuda or cpu")
    return folder, dest, calib.read_texts(calibration) if needs_text else None, group


def run_quantize(model: str | None, method: str, out: str, calibration: str | None = None,
                 device: str = "auto", num_samples: int = NUM_SAMPLES,
                 seq_len: int = SEQ_LEN, group_size: int | None = None) -> int:
    try:
        if method not in METHODS:
            raise BadRequest(f"unknown --method {method!r}; Hearth quantizes with awq (or rtn, "
                             "plain rounding in the same format: AWQ's baseline)")
        if num_samples < 1 or seq_len < 16:
            raise BadRequest("--num-samples must be 1 or more and --seq-len 16 or more")
        folder, dest, texts, group = _check(model, out, calibration if method == "awq" else None,
                                            device, method == "awq", group_size)
        _quantize(folder, dest, texts, device, num_samples, seq_len, group)
    except BadRequest as e:
        print(f"hearth quantize: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def _quantize(folder, dest: Path, texts: list[str] | None, device_arg: str, num_samples: int,
              seq_len: int, group: int = AWQ_GROUP) -> None:
    """texts None: round to nearest, no search (method rtn)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from engine.events import LoadRequest
    from engine.load.loader import choose_device
    from engine.quant import awq_format
    from engine.tools import awq_quantize, calibration

    hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    device = choose_device(LoadRequest(device=device_arg))
    # the search runs in the card's 16-bit dtype (AutoAWQ: fp16), on the CPU in fp32
    dtype = torch.float32 if device.type == "cpu" else (
        torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    say = lambda msg: print(f"[quantize] {msg}", file=sys.stderr, flush=True)
    say(f"reading {folder.path} ({folder.architecture}) on the CPU; searching on {device}")
    tokenizer = AutoTokenizer.from_pretrained(folder.path, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        folder.path, dtype=dtype, use_safetensors=True, trust_remote_code=False,
        attn_implementation="sdpa", device_map={"": "cpu"}).eval()
    seq_len = min(seq_len, int(folder.config.get("max_position_embeddings") or seq_len))
    blocks = None
    if texts is not None:
        blocks = torch.tensor(calibration.token_blocks(tokenizer, texts, num_samples, seq_len))
        say(f"calibration: {blocks.shape[0]} blocks of {blocks.shape[1]} tokens")
    tensors = awq_quantize.quantize_model(model, blocks, device,
                                          lambda done, total, msg: say(msg), group)
    dest.mkdir(parents=True, exist_ok=True)
    config = dict(folder.config, dtype="float16",
                  quantization_config=awq_format.quantization_config(group))
    config.pop("torch_dtype", None)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    nbytes = _save(tensors, dest)
    for f in folder.path.iterdir():  # tokenizer, chat template, generation config, licence...
        if f.is_file() and f.suffix != ".safetensors" and f.name not in SKIP_FILES:
            shutil.copy2(f, dest / f.name)
    size = f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"
    say(f"wrote {dest}: {size} of 4-bit weights in AWQ's format (group {group}) in "
        f"{time.perf_counter() - t0:.0f} s; run it with: hearth run --model {dest}")


def _save(tensors: dict, dest: Path) -> int:
    """One model.safetensors, or shards of at most 4 GiB with transformers' index."""
    from safetensors.torch import save_file

    shards: list[dict] = [{}]
    size = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t.contiguous()
        size += n
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if len(shards) == 1:
        save_file(shards[0], str(dest / "model.safetensors"), metadata={"format": "pt"})
        return total
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(dest / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return total
