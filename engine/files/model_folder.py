"""Find and check a model folder before anything heavy is imported (no torch here).

Every problem a user can fix is a `BadModel` with one sentence: the CLI prints it and exits 2,
the worker answers it with a `Failed` event. Weights are checked without reading them: the
safetensors header is parsed with the stdlib and its offsets compared with the file size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.events import BadRequest
from engine.files import model_home
from engine.files.tokenizer_files import check_text_files
from engine.formats import families, loadable
from engine.formats.model_shape import (
    ModelShape,
    PlanError,
    read_json_file,
    read_safetensors_header,
)
from hearth_resources import folder as resources_folder

# transformers class name -> model_type for every family that loads (the family registry, read
# at each use); anything else is refused at load, by name.
SUPPORTED_ARCHITECTURES = families.ARCHITECTURES
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
# the bundled demo model: package data (hearth_resources), in a clone and in an installed wheel
DEMO_MODEL_DIR = resources_folder() / "demo_model"


class BadModel(BadRequest):
    """The model folder cannot be used as it is."""


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    config: dict
    architecture: str  # transformers class name, e.g. "Qwen2ForCausalLM"
    weight_files: tuple[Path, ...]
    weights_bytes: int  # bytes of tensor data in the safetensors files

    @property
    def family(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]


def resolve(model: str | None) -> Path:
    """A local folder, a name in Hearth's models folder, a Hugging Face repo id already in the
    local cache, or (None) the demo model."""
    if model is None:
        if not (DEMO_MODEL_DIR / "config.json").is_file():
            raise BadModel(
                f"no --model given and the bundled demo model is missing from {DEMO_MODEL_DIR}; "
                "reinstall Hearth (pip install --force-reinstall PATH/TO/hearth)"
            )
        return DEMO_MODEL_DIR
    path = Path(model).expanduser()
    if path.exists():
        return path
    found = model_home.named_model(model) or model_home.cached_repo(model)
    if found is not None:
        return found
    if model.count("/") == 1 and not model.startswith(("/", ".", "~")):
        raise BadModel(f"model {model!r} is neither a folder nor a model in the local Hugging "
                       f"Face cache; `hearth pull {model}` downloads it")
    raise BadModel(f"model {model!r} is neither a folder nor a model in Hearth's models folder "
                   f"({model_home.models_dir()}); `hearth list` lists the models there")


def check(model: str | None) -> ModelFolder:
    """Resolve and validate; raises BadModel with one sentence naming what is wrong."""
    path = resolve(model)
    if path.is_file():
        if path.suffix == ".gguf" or _starts_with(path, b"GGUF"):
            raise BadModel(_gguf_message(path))
        raise BadModel(f"{path} is a file; --model takes a model folder (with config.json)")
    ggufs = sorted(path.glob("*.gguf"))
    config_path = path / "config.json"
    if not os.path.lexists(config_path):
        if ggufs:
            raise BadModel(_gguf_message(ggufs[0]))
        raise BadModel(f"{path} has no config.json, so it is not a Hugging Face model folder")
    config = _read_config(config_path)
    arch = _loadable_architecture(config)
    try:  # the sizes every load allocates from: absurd ones fail here, not in the allocator
        shape = ModelShape.from_config(config)
    except PlanError as e:
        raise BadModel(str(e)) from None
    weights = tuple(sorted(path.glob("*.safetensors")))
    if not weights:
        if any(path.glob("*.bin")) or any(path.glob("*.pt")) or any(path.glob("*.pth")):
            raise BadModel(
                f"{path} holds only pickle (.bin) weights, which Hearth never loads because "
                "unpickling can run code; convert them to safetensors first"
            )
        if ggufs:
            raise BadModel(_gguf_message(ggufs[0]))
        raise BadModel(f"{path} has no .safetensors weight files")
    tensors: dict[str, tuple[str, list[int]]] = {}
    data_bytes = 0
    for f in weights:
        found, nbytes = _header(f)
        tensors.update(found)
        data_bytes += nbytes
    _check_shapes(shape, tensors)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise BadModel(f"{path} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)")
    try:
        check_text_files(path)
    except PlanError as e:
        raise BadModel(str(e)) from None
    return ModelFolder(path, config, arch, weights, data_bytes)


def _read_config(config_path: Path) -> dict:
    try:
        config = read_json_file(config_path)
    except PlanError as e:
        raise BadModel(str(e)) from None
    if not isinstance(config, dict):
        raise BadModel(f"{config_path} does not hold a JSON object")
    return config


def _loadable_architecture(config: dict) -> str:
    """The class the load builds; BadModel where the shared rule refuses it (formats/loadable)."""
    reason = loadable.refusal(config)
    if reason is not None:
        raise BadModel(reason)
    return loadable.architecture(config)


def _header(path: Path) -> tuple[dict[str, tuple[str, list[int]]], int]:
    """The safetensors header, checked entry by entry against the file size (no data read)."""
    try:
        return read_safetensors_header(path)
    except PlanError as e:
        raise BadModel(str(e)) from None


# tensor name suffix -> its [rows, columns] from the config's sizes (Llama/Qwen/Mistral/Gemma;
# Phi-3's fused projections): a config that disagrees with its weights fails here, in one line
def _expected(s: ModelShape) -> dict[str, list[int]]:
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    return {"embed_tokens.weight": [s.vocab_size, s.hidden_size],
            "self_attn.q_proj.weight": [q, s.hidden_size],
            "self_attn.k_proj.weight": [kv, s.hidden_size],
            "self_attn.v_proj.weight": [kv, s.hidden_size],
            "self_attn.o_proj.weight": [s.hidden_size, q],
            "self_attn.qkv_proj.weight": [q + 2 * kv, s.hidden_size],
            "mlp.up_proj.weight": [s.intermediate_size, s.hidden_size],
            "mlp.gate_up_proj.weight": [2 * s.intermediate_size, s.hidden_size],
            "mlp.down_proj.weight": [s.hidden_size, s.intermediate_size]}


def _check_shapes(shape: ModelShape, tensors: dict[str, tuple[str, list[int]]]) -> None:
    if shape.quant_method is not None:
        return  # packed layouts (AWQ, bitsandbytes): their loaders check them
    expected = _expected(shape)
    layers = set()
    for name, (_, dims) in tensors.items():
        if "vision" in name or "visual" in name:
            continue  # a multimodal checkpoint's own tower: not the decoder the config sizes
        parts = name.split(".")
        if "layers" in parts[:-1] and parts[parts.index("layers") + 1].isdigit():
            layers.add(int(parts[parts.index("layers") + 1]))
        key = next((k for k in expected if name.endswith("." + k) or name == k), None)
        if key is not None and dims != expected[key]:
            raise BadModel(f"config.json does not match the weights: {name} is {dims} but the "
                           f"config's sizes make it {expected[key]}")
    if layers and layers != set(range(shape.num_layers)):
        raise BadModel(f"config.json has num_hidden_layers = {shape.num_layers} but the weights "
                       f"hold {len(layers)} layers")


def _starts_with(path: Path, magic: bytes) -> bool:
    with path.open("rb") as f:
        return f.read(len(magic)) == magic


def _gguf_message(path: Path) -> str:
    return (
        f"{path.name} is a GGUF file; Hearth reads Hugging Face safetensors checkpoints "
        "(download the model's original repository, e.g. with `hf download ORG/NAME`)"
    )


def config_only_folder(model: str | None) -> ModelFolder:
    """A folder with a config.json and no weights (`--random-weights`: real shapes for benchmarks);
    the architecture must still be one the engine supports."""
    path = resolve(model)
    cfg_path = path / "config.json"
    if not os.path.lexists(cfg_path):
        raise BadModel(f"{path} has no config.json")
    config = _read_config(cfg_path)
    arch = _loadable_architecture(config)
    try:
        ModelShape.from_config(config)
    except PlanError as e:
        raise BadModel(str(e)) from None
    return ModelFolder(path, config, arch, (), 0)
