"""Find and check a model folder before anything heavy is imported (no torch here).

Every problem a user can fix is a `BadModel` with one sentence: the CLI prints it and exits 2,
the worker answers it with a `Failed` event. Weights are checked without reading them: the
safetensors header is parsed with the stdlib and its offsets compared with the file size.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from engine.events import BadRequest

# transformers class names the engine runs; anything else is refused at load, by name.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "GemmaForCausalLM": "gemma",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
DEMO_MODEL_DIR = Path(__file__).resolve().parent.parent / "resources" / "demo_model"


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
    """A local folder, a Hugging Face repo id already in the local cache, or the demo model."""
    if model is None:
        if not (DEMO_MODEL_DIR / "config.json").is_file():
            raise BadModel(
                "no --model given and the bundled demo model is missing; pass --model PATH"
            )
        return DEMO_MODEL_DIR
    path = Path(model).expanduser()
    if path.exists():
        return path
    cached = _hub_cache_snapshot(model)
    if cached is not None:
        return cached
    raise BadModel(
        f"model {model!r} is neither a folder nor a model in the local Hugging Face cache")


def _hub_cache_snapshot(repo_id: str) -> Path | None:
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
        return None
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(
        os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        snap = repo / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").is_dir() else []
    return snaps[-1] if snaps else None


def check(model: str | None) -> ModelFolder:
    """Resolve and validate; raises BadModel with one sentence naming what is wrong."""
    path = resolve(model)
    if path.is_file():
        if path.suffix == ".gguf" or _starts_with(path, b"GGUF"):
            raise BadModel(_gguf_message(path))
        raise BadModel(f"{path} is a file; --model takes a model folder (with config.json)")
    ggufs = sorted(path.glob("*.gguf"))
    config_path = path / "config.json"
    if not config_path.is_file():
        if ggufs:
            raise BadModel(_gguf_message(ggufs[0]))
        raise BadModel(f"{path} has no config.json, so it is not a Hugging Face model folder")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadModel(f"{config_path} is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise BadModel(f"{config_path} does not hold a JSON object")
    arch = _architecture(config)
    if arch not in SUPPORTED_ARCHITECTURES:
        names = ", ".join(sorted(set(SUPPORTED_ARCHITECTURES.values())))
        raise BadModel(f"architecture {arch} is not supported; Hearth runs {names}")
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
    data_bytes = sum(_check_safetensors(f) for f in weights)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise BadModel(f"{path} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)")
    return ModelFolder(path, config, arch, weights, data_bytes)


def _architecture(config: dict) -> str:
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    model_type = config.get("model_type")
    for cls, family in SUPPORTED_ARCHITECTURES.items():
        if family == model_type:
            return cls
    return str(model_type or "unknown (config.json names none)")


def _check_safetensors(path: Path) -> int:
    """Parse the header only; a truncated or corrupt file is a BadModel. Returns data bytes."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise BadModel(f"{path.name} is truncated (shorter than a safetensors header)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(size - 8, 100_000_000):
            raise BadModel(f"{path.name} is corrupt or truncated (its header runs past the end)")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadModel(f"{path.name} is corrupt (its safetensors header is not JSON)") from None
    if not isinstance(header, dict):
        raise BadModel(f"{path.name} is corrupt (its safetensors header is not an object)")
    end = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(meta["data_offsets"][1]))
        except (KeyError, TypeError, IndexError, ValueError):
            raise BadModel(f"{path.name} is corrupt (tensor {name} has no data offsets)") from None
    if 8 + header_len + end > size:
        raise BadModel(
            f"{path.name} is truncated: its header promises {8 + header_len + end} bytes "
            f"but the file has {size}; download it again"
        )
    return end


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
    if not cfg_path.is_file():
        raise BadModel(f"{path} has no config.json")
    config = json.loads(cfg_path.read_text())
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise BadModel(f"architecture {arch} is not supported")
    return ModelFolder(path, config, arch, (), 0)
