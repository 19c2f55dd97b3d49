"""What a Hugging Face repo holds and which of its files Hearth would download: the file list
with sizes from the Hub API, and config.json for the planner, before any weight is fetched.
Whatever the Hub (or HF_ENDPOINT) answers is checked here before it can become a path.
Blocking network calls: the window's "Get a model" runs them off the GUI thread
(app/get_model/model_download.py), `hearth pull` in the foreground (cli/pull_cli.py)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from urllib.parse import urlparse

from engine.files.model_home import is_commit_id
from engine.formats import loadable

# beside the *.safetensors weights (and their index), what loading and chatting need
SMALL_FILES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "chat_template.jinja", "chat_template.json",
})
# the Hub's own rules: ASCII letters, digits, `-_.`, at most 96 a part, no `--` or `..` (the cache
# writes `/` as `--`, so a `--` would make two repos share a folder)
REPO_PART = r"\w(?:[\w.-]{0,94}\w)?"  # as huggingface_hub's \b[\w.-]{1,96}\b
REPO_ID = re.compile(rf"{REPO_PART}/{REPO_PART}", re.ASCII)  # fullmatch: `$` passes a "\n"
HUB_URL = re.compile(r"^https?://[^/]+/([^/]+/[^/?#]+)")
SHA256 = re.compile(r"[0-9a-f]{64}")
# characters that change where a path points on some OS (`\` and `C:` on Windows), or end it
UNSAFE_NAME_CHARS = re.compile(r"[\\:\x00-\x1f\x7f]")
MAX_LISTING_BYTES = 32 << 20  # the model info of a repo with thousands of files is a few MB
MAX_CONFIG_BYTES = 4 << 20
MAX_ERROR_BODY_BYTES = 1 << 20
LISTING_TIMEOUT_S = 30.0


class HubError(Exception):
    """A check or download that cannot go on: one sentence for the user."""


class RepoRefused(HubError):
    """The repo asked for is not one Hearth can have: not a repo id, not on the Hub (or gated),
    no safetensors weights or no config.json. Bad input, where the rest is a network's fault."""


@dataclass(frozen=True)
class RepoFile:
    name: str
    size: int  # bytes; 0 where the Hub did not say
    sha256: str | None = None  # the LFS object id the Hub lists, checked after download


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
    def refusal(self) -> str | None:
        """Why the loader would refuse it once downloaded (formats/loadable.py); None: it loads."""
        return loadable.refusal(self.config)

    @property
    def is_supported(self) -> bool:
        return self.refusal is None


def endpoint() -> str | None:
    """$HF_ENDPOINT, read at each call (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or None


def parse_repo_id(text: str) -> str:
    """`org/name`, or a huggingface.co page address; raises HubError otherwise."""
    text = text.strip()
    match = HUB_URL.match(text)
    repo_id = match.group(1) if match else text
    if not REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id:
        raise RepoRefused(f"{text!r} is not a Hugging Face repo id; write it as org/name, "
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


def is_sha256(text: object) -> bool:
    return isinstance(text, str) and SHA256.fullmatch(text) is not None


def is_safe_name(name: object) -> bool:
    """A relative path of plain segments: no `..`, no absolute path, no backslash or drive, no
    empty segment, on every OS (a Hub file name becomes a path under snapshots/)."""
    if not isinstance(name, str) or not name or UNSAFE_NAME_CHARS.search(name):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def fetch_listing(text: str) -> RepoListing:
    """The repo's files and config.json; raises HubError with one sentence."""
    from huggingface_hub import hf_hub_url

    repo_id = parse_repo_id(text)
    host = _host()
    try:
        raw = get_bounded(f"{endpoint() or 'https://huggingface.co'}/api/models/{repo_id}",
                          MAX_LISTING_BYTES, f"the file list of {repo_id}",
                          params={"blobs": "true"})
        info = _json(raw, f"the file list of {repo_id}")
        commit = info.get("sha") if isinstance(info, dict) else None
        if not commit:
            raise HubError(f"the Hub named no revision of {repo_id}; try again later")
        if not is_commit_id(commit):
            raise HubError(f"{host} named the revision of {repo_id} {str(commit)[:60]!r}, which "
                           "is not a commit id; nothing was downloaded")
        found = _siblings(info, repo_id, host)
        names = wanted(list(found))
        if not any(n.endswith(".safetensors") for n in names):
            others = ", ".join(sorted(n for n in found if n.endswith((".bin", ".gguf", ".pt")))[:3])
            raise RepoRefused(f"{repo_id} has no safetensors weights"
                           + (f" (only {others})" if others else "")
                           + "; Hearth loads safetensors only")
        if "config.json" not in names:
            raise RepoRefused(f"{repo_id} has no config.json, so it is not a transformers "
                              "model")
        # read into memory, not the cache: nothing is kept yet
        url = hf_hub_url(repo_id, "config.json", revision=commit, endpoint=endpoint())
        config = _json(get_bounded(url, MAX_CONFIG_BYTES, f"config.json of {repo_id}"),
                       f"config.json of {repo_id}")
        if not isinstance(config, dict):
            raise HubError(f"config.json of {repo_id} does not hold a JSON object")
    except HubError:
        raise
    except Exception as e:
        from huggingface_hub import errors

        missing = isinstance(e, (errors.RepositoryNotFoundError, errors.GatedRepoError))
        raise (RepoRefused if missing else HubError)(explain(e, repo_id)) from e
    files = tuple(found[n] for n in names)
    return RepoListing(repo_id, commit, files, len(found) - len(names), config)


def _siblings(info: dict, repo_id: str, host: str) -> dict[str, RepoFile]:
    """name -> RepoFile for every file the Hub lists; a listing that names a file outside the
    repo, or gives sizes and hashes of the wrong shape, is refused whole."""
    siblings = info.get("siblings") or []
    if not isinstance(siblings, list):
        raise HubError(f"{host} sent a malformed file list for {repo_id}")
    found = {}
    for s in siblings:
        name = s.get("rfilename") if isinstance(s, dict) else None
        if not is_safe_name(name):
            raise HubError(f"{host} listed a file named {str(name)[:80]!r} in {repo_id}, which "
                           "would be written outside the model's folder; nothing was downloaded")
        lfs = s.get("lfs") if isinstance(s.get("lfs"), dict) else {}
        size = s.get("size") or lfs.get("size") or 0
        sha256 = lfs.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise HubError(f"{host} gave {name} of {repo_id} the size {str(size)[:40]!r}, which "
                           "is not a byte count")
        if sha256 is not None and not is_sha256(sha256):
            raise HubError(f"{host} gave {name} of {repo_id} a malformed sha256")
        found[name] = RepoFile(name, size, sha256)
    return found


def get_bounded(url: str, max_bytes: int, what: str, params: dict | None = None) -> bytes:
    """A whole small response, refused as soon as it passes max_bytes (an endless or huge
    answer never fills memory)."""
    from huggingface_hub.utils import build_hf_headers, get_session

    with get_session().stream("GET", url, headers=build_hf_headers(), params=params,
                              timeout=LISTING_TIMEOUT_S) as response:
        raise_for_status(response)
        data = bytearray()
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) > max_bytes:
                raise HubError(f"{what} from {_host()} is larger than {max_bytes:,} bytes, "
                               "which no Hub sends; nothing was kept")
    return bytes(data)


def raise_for_status(response) -> None:
    """huggingface_hub's error for a failed answer (gated, missing, ...); it reads the error's
    body, so a body that is large or of unknown length is refused unread."""
    from huggingface_hub.utils import hf_raise_for_status

    if response.status_code < 400:
        return
    length = response.headers.get("Content-Length", "")
    if not (length.isdigit() and int(length) <= MAX_ERROR_BODY_BYTES):
        raise HubError(f"{_host()} answered HTTP {response.status_code}")
    hf_raise_for_status(response)


def _json(raw: bytes, what: str):
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise HubError(f"{what} from {_host()} is not valid JSON") from None


def _host() -> str:
    return urlparse(endpoint() or "https://huggingface.co").netloc


def explain(error: Exception, repo_id: str) -> str:
    """One sentence for a huggingface_hub or network error."""
    from huggingface_hub import errors

    host = _host()
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
