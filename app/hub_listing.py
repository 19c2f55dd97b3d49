"""What a Hugging Face repo holds and which of its files Hearth would download: the file list
with sizes from the Hub API, and config.json for the planner, before any weight is fetched.
Blocking network calls: model_download.py runs them off the GUI thread."""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from engine.model_folder import SUPPORTED_ARCHITECTURES

# beside the *.safetensors weights (and their index), what loading and chatting need
SMALL_FILES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "chat_template.jinja", "chat_template.json",
})
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HUB_URL = re.compile(r"^https?://[^/]+/([^/]+/[^/?#]+)")


class HubError(Exception):
    """A check or download that cannot go on: one sentence for the user."""


@dataclass(frozen=True)
class RepoFile:
    name: str
    size: int  # bytes; 0 where the Hub did not say


@dataclass(frozen=True)
class RepoListing:
    repo_id: str
    commit: str  # the revision the files are fetched at, so that they all match
    files: tuple[RepoFile, ...]  # what Hearth downloads, weights first and config.json last
    num_skipped_files: int  # pickles, ONNX, GGUF, other formats in subfolders
    config: dict

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weights_bytes(self) -> int:
        return sum(f.size for f in self.files if f.name.endswith(".safetensors"))

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures")
        return archs[0] if isinstance(archs, list) and archs else str(self.config.get(
            "model_type", "unknown"))

    @property
    def is_supported(self) -> bool:
        return self.architecture in SUPPORTED_ARCHITECTURES


def endpoint() -> str | None:
    """$HF_ENDPOINT, read at each call (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or None


def parse_repo_id(text: str) -> str:
    """`org/name`, or a huggingface.co page address; raises HubError otherwise."""
    text = text.strip()
    match = HUB_URL.match(text)
    repo_id = match.group(1) if match else text
    if not REPO_ID.match(repo_id):
        raise HubError(f"{text!r} is not a Hugging Face repo id; write it as org/name, "
                       "for example Qwen/Qwen2.5-0.5B-Instruct")
    return repo_id


def wanted(names: list[str]) -> list[str]:
    """The files Hearth downloads, in download order: weights, small files, config.json last
    (a snapshot without its config.json is not listed as a model, so a partial one stays out)."""
    top = [n for n in names if "/" not in n]  # subfolders hold other formats (onnx/, original/)
    weights = [n for n in top if n.endswith(".safetensors")]
    if any(n.startswith("model") for n in weights):  # Mistral ships its own format beside them
        weights = [n for n in weights if not n.startswith("consolidated")]
    small = [n for n in top if n in SMALL_FILES or n.endswith(".safetensors.index.json")]
    small.sort(key=lambda n: n == "config.json")
    return sorted(weights) + small


def fetch_listing(text: str) -> RepoListing:
    """The repo's files and config.json; raises HubError with one sentence."""
    from huggingface_hub import HfApi, hf_hub_download

    repo_id = parse_repo_id(text)
    try:
        info = HfApi(endpoint=endpoint()).model_info(repo_id, files_metadata=True)
        if not info.sha:
            raise HubError(f"the Hub named no revision of {repo_id}; try again later")
        sizes = {s.rfilename: s.size or (s.lfs.size if s.lfs else 0) for s in info.siblings or ()}
        names = wanted(list(sizes))
        if not any(n.endswith(".safetensors") for n in names):
            others = ", ".join(sorted(n for n in sizes if n.endswith((".bin", ".gguf", ".pt")))[:3])
            raise HubError(f"{repo_id} has no safetensors weights"
                           + (f" (only {others})" if others else "")
                           + "; Hearth loads safetensors only")
        if "config.json" not in names:
            raise HubError(f"{repo_id} has no config.json, so it is not a transformers model")
        with tempfile.TemporaryDirectory() as tmp:  # not the cache: nothing is kept yet
            path = hf_hub_download(repo_id, "config.json", revision=info.sha, cache_dir=tmp,
                                   endpoint=endpoint())
            config = json.loads(Path(path).read_text(encoding="utf-8"))
    except HubError:
        raise
    except Exception as e:
        raise HubError(explain(e, repo_id)) from e
    files = tuple(RepoFile(n, sizes[n]) for n in names)
    return RepoListing(repo_id, info.sha, files, len(sizes) - len(names), config)


def explain(error: Exception, repo_id: str) -> str:
    """One sentence for a huggingface_hub or network error."""
    from huggingface_hub import errors

    host = urlparse(endpoint() or "https://huggingface.co").netloc
    if isinstance(error, errors.GatedRepoError):
        return (f"{repo_id} is gated: accept its terms on {host} and log in here with "
                "`hf auth login`")
    if isinstance(error, errors.RepositoryNotFoundError):
        return f"there is no model {repo_id} on {host} (or it is private: log in with " \
               "`hf auth login`)"
    if isinstance(error, errors.OfflineModeIsEnabled):
        return "Hugging Face offline mode is on (HF_HUB_OFFLINE); unset it to download"
    if isinstance(error, errors.HfHubHTTPError):
        return f"{host} answered: {str(error).splitlines()[0]}"
    if type(error).__module__.startswith("httpx"):  # huggingface_hub's HTTP client
        return f"could not reach {host}: {error or type(error).__name__}"
    if isinstance(error, (OSError, ValueError)):
        return f"{type(error).__name__}: {error}"
    return f"unexpected {type(error).__name__}: {error}"
