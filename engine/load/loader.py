"""Load a checked model folder: weights (bf16/fp16/fp32, INT8, NF4 or AWQ), tokenizer, generation
config.

safetensors only, never `trust_remote_code`. The model runs with the engine's attention function
(attention/prefill.py), so its KV cache and masks are the engine's own, whatever the architecture.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.attention import prefill as attention
from engine.config.backends import DEFAULTS, Backends
from engine.events import BadRequest, LoadProgress, LoadRequest
from engine.files.model_folder import ModelFolder
from engine.formats import families, weights
from engine.formats.sampling_defaults import model_defaults
from engine.load import checkpoint_checks, experts_quant, language_model, weight_loaders
from engine.load.memory_limit import (  # noqa: F401 (callers and tests import them here)
    apply_memory_limit,
    clear_memory_limit,
    cuda_context_bytes,
)
from engine.platform import allocator, library_noise, nvrtc

DTYPES = {f.name: getattr(torch, f.torch_dtype) for f in weights.floats()}  # "bf16": bfloat16
CONFIG_DTYPES = {f.torch_dtype: f.name for f in weights.floats()}  # config.json's "bfloat16"
DEFAULT_MAX_CONTEXT = 8192  # until the planner chooses: a chat-sized cache, not 128K of zeros


class LoadCancelled(Exception):
    pass


@dataclass
class LoadedModel:
    folder: ModelFolder
    model: torch.nn.Module
    tokenizer: object
    gen_config: dict
    eos_ids: frozenset[int]
    device: torch.device
    quant: str
    compute_dtype: torch.dtype
    context: int
    notes: tuple[str, ...]

    @property
    def weights_bytes(self) -> int:
        return self.model.get_memory_footprint()

    @property
    def sampling_defaults(self) -> dict:
        """What a request's unset sampling settings take (formats/sampling_defaults.py)."""
        return model_defaults(self.gen_config, self.folder.family)


def choose_device(req: LoadRequest) -> torch.device:
    if req.device == "cuda" and not torch.cuda.is_available():
        raise BadRequest("--device cuda was asked for but torch sees no CUDA GPU")
    if req.device == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def choose_quant(req: LoadRequest, folder: ModelFolder, device: torch.device,
                 random_weights: bool = False) -> str:
    held = next((q for q in weights.names() if weight_loaders.of(q).holds(folder.config)), None)
    if held:  # quantized already: it loads as it is
        if req.quant not in ("auto", held):
            raise BadRequest(f"{folder.path.name} is an {held.upper()} checkpoint: it loads as "
                             f"--quant {held} (or auto), not {req.quant}")
        return held
    if req.quant == "auto":
        native = CONFIG_DTYPES.get(str(folder.config.get("dtype")
                                       or folder.config.get("torch_dtype")))
        if device.type == "cpu":
            return native or "fp32"  # CPU keeps the checkpoint's own dtype
        return _recommended_quant(req, folder, device)
    fmt = weights.get(req.quant)
    if not fmt.rounds_at_load and not (random_weights or experts_quant.rounds(folder, fmt.name)):
        word = fmt.name.upper()  # a checkpoint must hold it: `hearth quantize` makes one
        raise BadRequest(f"{folder.path.name} is not an {word} checkpoint; make a {fmt.bits}-bit "
                         f"{word} copy with `hearth quantize --model PATH --method {fmt.name} "
                         "--out NEW_PATH`, or load it with --quant nf4")
    if fmt.library and importlib.util.find_spec(fmt.library) is None:
        raise BadRequest(f"--quant {fmt.name} needs {fmt.library} (pip install {fmt.library})")
    return fmt.name


def _recommended_quant(req: LoadRequest, folder: ModelFolder, device: torch.device) -> str:
    """The planner's choice for this card: 16-bit where it fits, else 4-bit (NF4)."""
    from engine.formats.model_shape import ModelShape
    from engine.plan.memory import recommend

    sixteen = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    props = torch.cuda.get_device_properties(device)
    vram = int(req.memory_limit_gib * 2**30) if req.memory_limit_gib else props.total_memory
    try:
        rec = recommend(ModelShape.from_folder(folder.path), vram, (props.major, props.minor),
                        req.context)
    except ValueError:  # a config the planner cannot read: the safe 16-bit default
        return sixteen
    return rec.quant if rec.fits and weights.get(rec.quant).rounds_at_load else sixteen


def _placement(req: LoadRequest, folder: ModelFolder, random_weights: bool = False
               ) -> tuple[torch.device, str, torch.dtype]:
    """Device, weight format and compute dtype for a load; applies --memory-limit."""
    allocator.configure()  # before anything starts CUDA in this process
    device = choose_device(req)
    quant = choose_quant(req, folder, device, random_weights)
    apply_memory_limit(device, req.memory_limit_gib)
    # quantized weights keep their unquantized parts (embeddings, norms) in 16 bits; AWQ too
    # (bf16 where the card has it: tinygemm's dtype, and no fp16 overflow in activations)
    compute_dtype = DTYPES.get(quant, torch.bfloat16)
    if weights.get(quant).quantized and device.type == "cuda" and (
            not torch.cuda.is_bf16_supported()):
        compute_dtype = torch.float16
    return device, quant, compute_dtype


def load(folder: ModelFolder, req: LoadRequest, progress: Callable[[LoadProgress], None],
         cancel: threading.Event | None = None, tokenizer=None,
         backends: Backends = DEFAULTS) -> LoadedModel:
    """`tokenizer`: the folder's, where the caller has read it already (a draft's check);
    `backends`: the session's settings (the int4 kernel, its prefill products, PDL)."""
    nvrtc.use_pdl(backends.pdl)  # before any kernel of this load compiles
    library_noise.skip_torchao()  # before transformers' quantizer registry loads
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress travels as LoadProgress events instead

    def stage(name: str, done: int, message: str = ""):
        if cancel is not None and cancel.is_set():
            raise LoadCancelled()
        progress(LoadProgress(name, done, 4, message))

    checkpoint_checks.check_rope(folder)  # before anything reads the config
    device, quant, compute_dtype = _placement(req, folder)

    stage("tokenizer", 0, "reading the tokenizer")
    if tokenizer is None:
        tokenizer = read_tokenizer(folder)
    library_noise.quiet_tokenizer(tokenizer)
    gen_config = _read_json(folder.path / "generation_config.json")

    slow = _slow_on_cpu(quant, device)
    stage("weights", 1, f"loading weights as {quant}" + (f" ({slow})" if slow else ""))
    formatted, forced = weight_loaders.of(quant), backends.int4_kernel
    if experts_quant.rounds(folder, quant):  # a mixture of experts, its experts in 4 bits too
        model = experts_quant.load_model(folder, device, compute_dtype, quant,
                                         formatted.round_linears, forced)
    else:
        model = formatted.load(folder, device, compute_dtype, forced)
    formatted.own(model, device, backends)
    head_notes = _quantize_lm_head(model, req, device, compute_dtype)
    stage("attention", 2, "installing the engine's attention")
    attention.register()
    model.set_attn_implementation(attention.ATTN_IMPLEMENTATION)

    context, notes = _context(folder, req.context)
    notes += head_notes + ([slow] if slow else [])
    stage("ready", 3)
    return LoadedModel(folder, model, tokenizer, gen_config, _eos_ids(model, tokenizer, gen_config),
                       device, quant, compute_dtype, context, tuple(notes))


def read_tokenizer(folder: ModelFolder):
    """The folder's tokenizer; one that the library cannot build is the folder's fault."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder.path, trust_remote_code=False)
    except Exception as e:  # tokenizers' own errors are plain Exceptions
        raise BadRequest(f"the tokenizer in {folder.path} cannot be read: "
                         f"{_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _slow_on_cpu(quant: str, device: torch.device) -> str:
    """bitsandbytes runs its 4- and 8-bit layers on the CPU, but dequantizes every step."""
    if device.type != "cpu" or not weights.get(quant).slow_on_cpu:
        return ""
    return (f"note: {quant} on the CPU is slower than fp32/bf16 and saves only memory; "
            "it is meant for GPUs")


def random_model(folder: ModelFolder, req: LoadRequest, backends: Backends = DEFAULTS
                 ) -> LoadedModel:
    """A model with real shapes and random weights, from config.json alone (benchmarks)."""
    nvrtc.use_pdl(backends.pdl)
    library_noise.skip_torchao()
    from transformers import AutoConfig

    checkpoint_checks.check_rope(folder)
    device, quant, compute_dtype = _placement(req, folder, random_weights=True)
    config = language_model.text_config(
        AutoConfig.from_pretrained(folder.path, trust_remote_code=False))
    torch.manual_seed(0)
    formatted = weight_loaders.of(quant)
    model = formatted.random(config, folder.architecture, device, compute_dtype,
                             backends.int4_kernel, small_card=req.memory_limit_gib is not None)
    formatted.own(model, device, backends)
    head_notes = _quantize_lm_head(model, req, device, compute_dtype)
    attention.register()
    model.set_attn_implementation(attention.ATTN_IMPLEMENTATION)
    context, notes = _context(folder, req.context)
    notes += head_notes
    gen = {"eos_token_id": config.eos_token_id}
    return LoadedModel(folder, model, None, gen, _eos_ids(model, None, gen), device, quant,
                       compute_dtype, context, (*notes, "random weights"))


def _quantize_lm_head(model, req: LoadRequest, device, dtype) -> list[str]:
    if req.lm_head == "16bit":
        return []
    from engine.quant.lm_head import quantize_lm_head

    return [quantize_lm_head(model, req.lm_head, device, dtype)]


def _read_json(path) -> dict:
    """model_folder.check has refused a broken file; a missing one means no defaults."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _eos_ids(model, tokenizer, gen_config: dict) -> frozenset[int]:
    ids: set[int] = set()
    for source in (gen_config.get("eos_token_id"), model.config.eos_token_id,
                   getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list):
            ids.update(i for i in source if isinstance(i, int))
    return frozenset(ids)


def _context(folder: ModelFolder, requested: int | None) -> tuple[int, list[str]]:
    """The cache length: requested or a chat-sized default, capped by the model's limits (and
    a sliding window, unless the family masks each windowed layer: sliding_layers)."""
    notes, text = [], folder.config.get("text_config")
    config = {**folder.config, **text} if isinstance(text, dict) else folder.config
    native = config.get("max_position_embeddings")  # a whole number: model_folder checked it
    native = native if isinstance(native, int) else DEFAULT_MAX_CONTEXT
    context = requested or min(native, DEFAULT_MAX_CONTEXT)
    if context > native:
        raise BadRequest(f"context {context} is longer than the model's {native} positions")
    window = config.get("sliding_window")
    masked = getattr(families.get(folder.family), "sliding_layers", False)
    if not masked and config.get("use_sliding_window") is not False and isinstance(
            window, int) and window < context:
        notes.append(f"context capped at the model's sliding window of {window} tokens")
        context = window  # all of its attention is windowed: stay inside the window
    return context, notes
