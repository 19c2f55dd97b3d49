"""Fetch a listed repo's files into the Hugging Face cache, resumably. Each file grows in
blobs/<etag>.incomplete, is continued with an HTTP Range request after a cancel, a lost
connection or a restart, then moves into place and is linked from snapshots/<commit>/ the way
huggingface_hub lays out its cache, so the engine (and `hf`) see an ordinary snapshot.

huggingface_hub's own hf_hub_download (2.x) starts a cut-off file over; this does not."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from app.hub_listing import HubError, RepoListing, endpoint, explain

CHUNK_BYTES = 1 << 20  # a cancel lands within one chunk
READ_TIMEOUT_S = 30.0


class DownloadCancelled(Exception):
    """The user stopped the download; what arrived is kept for the next try."""


@dataclass(frozen=True)
class DownloadProgress:
    done_bytes: int
    total_bytes: int
    file_name: str  # the file being fetched
    num_files_done: int
    num_files: int


def repo_folder(cache_dir: Path, repo_id: str) -> Path:
    return cache_dir / ("models--" + repo_id.replace("/", "--"))


def download(listing: RepoListing, cache_dir: Path,
             on_progress: Callable[[DownloadProgress], None],
             is_cancelled: Callable[[], bool]) -> Path:
    """Fetch every file not yet in the snapshot; returns the snapshot folder.

    Raises DownloadCancelled, or HubError with one sentence.
    """
    repo = repo_folder(cache_dir, listing.repo_id)
    snapshot = repo / "snapshots" / listing.commit
    num_files, total = len(listing.files), listing.total_bytes
    _check_disk_space(listing, repo, snapshot)
    done = 0
    for i, f in enumerate(listing.files):
        if is_cancelled():
            raise DownloadCancelled()
        on_progress(DownloadProgress(done, total, f.name, i, num_files))
        pointer = snapshot / f.name
        if not pointer.exists():
            def on_bytes(n: int, done=done, f=f, i=i) -> None:
                on_progress(DownloadProgress(done + n, total, f.name, i, num_files))
            try:
                _fetch(listing, f.name, repo, pointer, on_bytes, is_cancelled)
            except (DownloadCancelled, HubError):
                raise
            except Exception as e:
                raise HubError(f"{f.name}: {explain(e, listing.repo_id)}") from e
        done += f.size
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(listing.commit)
    on_progress(DownloadProgress(total, total, "", num_files, num_files))
    return snapshot


def partial_files(cache_dir: Path, repo_id: str) -> list[Path]:
    """The cut-off files a later download continues."""
    return sorted((repo_folder(cache_dir, repo_id) / "blobs").glob("*.incomplete"))


def _check_disk_space(listing: RepoListing, repo: Path, snapshot: Path) -> None:
    """Refuse at the start rather than fail hours in with a full disk."""
    repo.mkdir(parents=True, exist_ok=True)
    missing = sum(f.size for f in listing.files if not (snapshot / f.name).exists())
    arrived = sum(p.stat().st_size for p in repo.glob("blobs/*.incomplete"))
    need, free = missing - arrived, shutil.disk_usage(repo).free
    if need > free:
        raise HubError(f"{listing.repo_id} needs {need / 1e9:.1f} GB more disk space; the disk "
                       f"of {repo.parent} has {free / 1e9:.1f} GB free")


def _fetch(listing: RepoListing, name: str, repo: Path, pointer: Path,
           on_bytes: Callable[[int], None], is_cancelled: Callable[[], bool]) -> None:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(listing.repo_id, name, revision=listing.commit, endpoint=endpoint())
    meta = get_hf_file_metadata(url, endpoint=endpoint())
    if not meta.etag:
        raise HubError(f"{name}: the server gave no ETag, so the file cannot be checked")
    blob = repo / "blobs" / meta.etag
    if not blob.exists():
        blob.parent.mkdir(parents=True, exist_ok=True)
        partial = blob.with_name(meta.etag + ".incomplete")
        have = partial.stat().st_size if partial.exists() else 0
        if meta.size is not None and have > meta.size:  # not this file's bytes: start over
            partial.unlink()
            have = 0
        if meta.size is None or have < meta.size:
            headers = build_hf_headers()
            headers["Accept-Encoding"] = "identity"  # byte offsets must be the file's own
            if urlparse(meta.location).netloc != urlparse(url).netloc:
                headers.pop("authorization", None)  # a signed CDN address: no token there
            if have:
                headers["Range"] = f"bytes={have}-"
            with get_session().stream("GET", meta.location, headers=headers,
                                      timeout=READ_TIMEOUT_S) as response:
                hf_raise_for_status(response)
                resumed = response.status_code == 206
                n = have if resumed else 0  # a 200 ignored the Range: the whole file comes
                with partial.open("ab" if resumed else "wb") as out:
                    for chunk in response.iter_bytes(CHUNK_BYTES):
                        out.write(chunk)
                        n += len(chunk)
                        on_bytes(n)
                        if is_cancelled():
                            raise DownloadCancelled()
        if meta.size is not None and partial.stat().st_size != meta.size:
            got = partial.stat().st_size
            partial.unlink()
            raise HubError(f"{name} arrived with {got:,} bytes instead of {meta.size:,}; "
                           "try again")
        os.replace(partial, blob)
    _link(blob, pointer)


def _link(blob: Path, pointer: Path) -> None:
    """snapshots/<commit>/<name> -> ../../blobs/<etag>, or a copy where links are refused."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink():  # a dangling link: its blob was deleted
        pointer.unlink()
    try:
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:
        shutil.copyfile(blob, pointer)
