"""GGUF files already on disk in LM Studio's and Ollama's model folders, offered for import.
Only lists them: every path is resolved and must stay inside its folder, and anything odd (a
hostile manifest, a FIFO, a file that is not GGUF) is skipped quietly; checking is the import's."""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
MODEL_LAYER = "application/vnd.ollama.image.model"
MAX_MANIFEST_BYTES = 256 << 10  # a real manifest is about 1 kB
MAX_FILES = 2_000  # entries looked at per folder: a huge or looping tree costs no more than this
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class GGUFSource:
    label: str  # "publisher/repo/file.gguf" (LM Studio) or "name:tag" (Ollama)
    path: Path  # the resolved file, inside its app's folder
    size_bytes: int  # on disk
    origin: str  # "LM Studio" or "Ollama"


def lmstudio_roots(home: Path | None = None) -> list[Path]:
    home = home or Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def ollama_root(home: Path | None = None) -> Path:
    if os.environ.get("OLLAMA_MODELS"):
        return Path(os.environ["OLLAMA_MODELS"]).expanduser()
    return (home or Path.home()) / ".ollama" / "models"


def find_gguf_files(home: Path | None = None) -> list[GGUFSource]:
    """LM Studio's files, then Ollama's models; one row per file (the first name seen)."""
    found, seen = [], set()
    for source in [*_lmstudio(home), *_ollama(home)]:
        if source.path not in seen:
            seen.add(source.path)
            found.append(source)
    return found


def _lmstudio(home: Path | None) -> list[GGUFSource]:
    found = []
    for root in lmstudio_roots(home):
        base = _resolved_dir(root)
        if base is None:
            continue
        # <publisher>/<repo>/<file>.gguf, as LM Studio downloads them
        for candidate in _children(base, 3):
            if candidate.suffix.lower() != ".gguf" or candidate.name.startswith("mmproj"):
                continue  # a vision projector is no language model
            source = _source(candidate, base, "/".join(candidate.relative_to(base).parts),
                             "LM Studio")
            if source is not None:
                found.append(source)
    return found


def _ollama(home: Path | None) -> list[GGUFSource]:
    base = _resolved_dir(ollama_root(home))
    if base is None:
        return []
    blobs = base / "blobs"
    found = []
    # manifests/<registry>/<namespace>/<name>/<tag>
    for manifest in _children(base / "manifests", 4):
        digest = _model_digest(manifest, base)
        if digest is None:
            continue
        registry, namespace, name, tag = manifest.relative_to(base / "manifests").parts
        label = (f"{name}:{tag}" if (registry, namespace) == ("registry.ollama.ai", "library")
                 else f"{registry}/{namespace}/{name}:{tag}")
        source = _source(blobs / f"sha256-{digest}", blobs, label, "Ollama")
        if source is not None:
            found.append(source)
    return found


def _model_digest(manifest: Path, base: Path) -> str | None:
    """The hex digest of the manifest's model layer, or None for anything unexpected."""
    if _inside(manifest, base) is None or not _is_regular(manifest, MAX_MANIFEST_BYTES):
        return None
    try:
        with manifest.open("rb") as f:
            data = json.loads(f.read(MAX_MANIFEST_BYTES))
    except (OSError, ValueError, RecursionError):  # unreadable, not JSON, nested to death
        return None
    layers = data.get("layers") if isinstance(data, dict) else None
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("mediaType") == MODEL_LAYER:
            digest = layer.get("digest")
            # the digest names a file: only sha256 and 64 hex digits, never `..` or a path
            match = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
            return match.group(1) if match else None
    return None


def _source(path: Path, base: Path, label: str, origin: str) -> GGUFSource | None:
    resolved = _inside(path, base)
    if resolved is None or not _is_regular(resolved):
        return None
    try:
        with resolved.open("rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return None
        size = resolved.stat().st_size
    except OSError:
        return None
    return GGUFSource(_UNPRINTABLE.sub("?", label), resolved, size, origin)


def _children(folder: Path, depth: int) -> list[Path]:
    """Entries exactly `depth` levels below folder, at most MAX_FILES of them, sorted."""
    level = [folder]
    for _ in range(depth):
        below = []
        for parent in level:
            try:
                with os.scandir(parent) as it:
                    for entry in it:
                        below.append(Path(entry.path))
                        if len(below) >= MAX_FILES:
                            break
            except OSError:
                continue  # not a folder, unreadable
            if len(below) >= MAX_FILES:
                break
        level = below
    return sorted(level)


def _resolved_dir(folder: Path) -> Path | None:
    try:
        resolved = folder.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        return None
    return resolved if resolved.is_dir() else None


def _inside(path: Path, base: Path) -> Path | None:
    """path resolved, if it stays inside base (a symlink or `..` leading out is refused)."""
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return resolved if resolved.is_relative_to(base) else None


def _is_regular(path: Path, max_bytes: int | None = None) -> bool:
    # a FIFO or a device would block or never end when read
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (max_bytes is None or st.st_size <= max_bytes)
