"""Fetch a listed repo's files into the Hugging Face cache, resumably. Each file grows in
blobs/<etag>.incomplete, is continued with an HTTP Range request after a cancel, a lost
connection or a restart, then moves into place and is linked from snapshots/<commit>/ the way
huggingface_hub lays out its cache, so the engine (and `hf`) see an ordinary snapshot.

Nothing the server says is trusted as a path or a length: commit ids, names and ETags are
checked, every path written is resolved inside the repo's folder, a stream stops at its declared
(else announced) size and never fills the disk past a margin, and an LFS file counts as complete
only once its sha256 matches.

huggingface_hub's own hf_hub_download (2.x) starts a cut-off file over; this does not."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from engine.files.hub_listing import (
    HubError,
    RepoFile,
    RepoListing,
    endpoint,
    explain,
    is_commit_id,
    is_safe_name,
    is_sha256,
    parse_repo_id,
    raise_for_status,
)

CHUNK_BYTES = 1 << 20  # a cancel lands within one chunk
READ_TIMEOUT_S = 30.0
# a small file the Hub gives no size for is cut off here (the largest tokenizer.json is ~35 MB)
MAX_UNDECLARED_BYTES = 128 << 20
DISK_MARGIN_BYTES = 10**9  # a download never leaves the disk with less than this free


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
    if parse_repo_id(listing.repo_id) != listing.repo_id:
        raise HubError(f"{listing.repo_id!r} is not a Hugging Face repo id")
    if not is_commit_id(listing.commit):
        raise HubError(f"the revision {listing.commit[:60]!r} of {listing.repo_id} is not a "
                       "commit id; nothing was downloaded")
    for f in listing.files:
        if not is_safe_name(f.name):
            raise HubError(f"{listing.repo_id} names a file {f.name[:80]!r}, which would be "
                           "written outside its folder; nothing was downloaded")
    repo = repo_folder(cache_dir, listing.repo_id)
    snapshot = repo / "snapshots" / listing.commit
    num_files, total = len(listing.files), listing.total_bytes
    _check_disk_space(listing, repo, snapshot)
    root = repo.resolve()  # every path written is checked against this (links included)
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
                _fetch(listing, f, root, pointer, on_bytes, is_cancelled)
            except (DownloadCancelled, HubError):
                raise
            except Exception as e:
                raise HubError(f"{f.name}: {explain(e, listing.repo_id)}") from e
        done += f.size
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    _inside(root, repo / "refs" / "main").write_text(listing.commit)
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
    need, free = missing - arrived, free_bytes(repo)
    if need > free - DISK_MARGIN_BYTES:
        raise HubError(f"{listing.repo_id} needs {need / 1e9:.1f} GB more disk space; the disk "
                       f"of {repo.parent} has {free / 1e9:.1f} GB free (Hearth leaves "
                       f"{DISK_MARGIN_BYTES / 1e9:.1f} GB)")


def free_bytes(folder: Path) -> int:
    """The free space of the disk holding `folder`."""
    return shutil.disk_usage(folder).free


def _fetch(listing: RepoListing, f: RepoFile, repo: Path, pointer: Path,
           on_bytes: Callable[[int], None], is_cancelled: Callable[[], bool]) -> None:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    name = f.name
    url = hf_hub_url(listing.repo_id, name, revision=listing.commit, endpoint=endpoint())
    meta = get_hf_file_metadata(url, endpoint=endpoint())
    if not meta.etag:
        raise HubError(f"{name}: the server gave no ETag, so the file cannot be checked")
    # the Hub's shapes: a git blob id (40 hex) or an LFS sha256 (64 hex); it names a file
    if not (is_commit_id(meta.etag) or is_sha256(meta.etag)):
        raise HubError(f"{name}: the server gave the ETag {meta.etag[:80]!r}, which is not a "
                       "file hash; nothing was written")
    size, sha256 = _expected(f, meta.size, meta.etag)
    blob = _inside(repo, repo / "blobs" / meta.etag)
    if blob.exists() and (not blob.is_file() or size is not None
                          and blob.stat().st_size != size):
        blob.unlink()  # not this file's bytes (a cut-off copy): fetch it again
    if not blob.exists():
        blob.parent.mkdir(parents=True, exist_ok=True)
        partial = _inside(repo, blob.with_name(meta.etag + ".incomplete"))
        have = partial.stat().st_size if partial.exists() else 0
        if size is not None and have > size:  # not this file's bytes: start over
            partial.unlink()
            have = 0
        hasher = hashlib.sha256() if sha256 else None
        if hasher and have:
            _hash_file(hasher, partial)  # bytes from an earlier try count towards the hash
        if size is None or have < size:
            headers = build_hf_headers()
            headers["Accept-Encoding"] = "identity"  # byte offsets must be the file's own
            if urlparse(meta.location).netloc != urlparse(url).netloc:
                headers.pop("authorization", None)  # a signed CDN address: no token there
            if have:
                headers["Range"] = f"bytes={have}-"
            with get_session().stream("GET", meta.location, headers=headers,
                                      timeout=READ_TIMEOUT_S) as response:
                raise_for_status(response)
                resumed = response.status_code == 206
                n = have if resumed else 0  # a 200 ignored the Range: the whole file comes
                max_bytes, said = _stream_bound(name, size, _announced(response, n), n, repo)
                if hasher and not resumed:
                    hasher = hashlib.sha256()
                too_long = False
                with partial.open("ab" if resumed else "wb") as out:
                    for chunk in response.iter_bytes(CHUNK_BYTES):
                        if n + len(chunk) > max_bytes:  # never write past the declared end
                            too_long = True
                            break
                        out.write(chunk)
                        if hasher:
                            hasher.update(chunk)
                        n += len(chunk)
                        on_bytes(n)
                        if is_cancelled():
                            raise DownloadCancelled()
            if too_long:
                partial.unlink()
                raise HubError(f"{name} kept coming past the {max_bytes:,} bytes {said}, so it "
                               "was stopped and deleted")
        got = partial.stat().st_size
        if size is not None and got != size:
            partial.unlink()
            raise HubError(f"{name} arrived with {got:,} bytes instead of {size:,}; try again")
        if hasher and hasher.hexdigest() != sha256:
            partial.unlink()
            raise HubError(f"{name} arrived with the wrong sha256 (not the {sha256[:12]}… the "
                           "Hub lists), so it was deleted; try again")
        os.replace(partial, blob)
    _link(repo, blob, pointer)


def _expected(f: RepoFile, head_size: int | None, etag: str) -> tuple[int | None, str | None]:
    """(size, sha256) the file must arrive with, from the listing and the file's headers; a
    weight needs at least one of them, and two answers that disagree are refused."""
    listed_size = f.size or None
    if listed_size and head_size is not None and head_size != listed_size:
        raise HubError(f"{f.name}: the Hub lists {listed_size:,} bytes but serves "
                       f"{head_size:,}; nothing was written")
    size = head_size if head_size is not None else listed_size
    sha256 = f.sha256
    if is_sha256(etag):  # an LFS file's ETag is its sha256
        if sha256 and etag != sha256:
            raise HubError(f"{f.name}: the Hub lists one sha256 and serves another; nothing "
                           "was written")
        sha256 = etag
    if f.name.endswith(".safetensors") and size is None and sha256 is None:
        raise HubError(f"{f.name}: the Hub gives neither its size nor its sha256, so its "
                       "download cannot be checked")
    return size, sha256


def _announced(response, start: int) -> int | None:
    """The whole file's size as the response announces it (Content-Range's total, else where it
    starts plus its Content-Length); None when it announces none."""
    total = response.headers.get("Content-Range", "").rpartition("/")[2].strip()
    length = response.headers.get("Content-Length", "").strip()
    if total.isdigit():
        return int(total)
    return start + int(length) if length.isdigit() else None


def _stream_bound(name: str, size: int | None, announced: int | None, start: int,
                  repo: Path) -> tuple[int, str]:
    """How large the file may grow in this stream (it holds `start` bytes), and what set that
    bound, for the error: the size the Hub declared, else the one the response announces, else
    a small file's cap; never past the disk's free space less a margin. A file announced larger
    than that is refused before a byte is written."""
    room = start + max(free_bytes(repo) - DISK_MARGIN_BYTES, 0)
    if size is not None or announced is not None:
        bound, said = (size, "declared") if size is not None else (announced, "announced")
        if bound > room:
            raise HubError(f"{name} is {bound / 1e9:.1f} GB, more than the disk of "
                           f"{repo.parent} can take while leaving "
                           f"{DISK_MARGIN_BYTES / 1e9:.1f} GB free, so it was not downloaded")
        return bound, said
    if not name.endswith(".safetensors") and MAX_UNDECLARED_BYTES <= room:
        return MAX_UNDECLARED_BYTES, "allowed for a file of unknown size"
    # a weight known only by its hash may not fill the disk before the hash is checked
    return room, f"the disk can take while leaving {DISK_MARGIN_BYTES / 1e9:.1f} GB free"


def _hash_file(hasher, path: Path) -> None:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            hasher.update(chunk)


def _inside(repo: Path, path: Path) -> Path:
    """path in its resolved folder, refused unless it (and where it links to) stays in the
    repo's folder."""
    where = path.parent.resolve() / path.name
    if not where.is_relative_to(repo) or (path.is_symlink()
                                          and not path.resolve().is_relative_to(repo)):
        raise HubError(f"{path.name[:80]!r} would be written outside {repo}; nothing was "
                       "written there")
    return where


def _link(repo: Path, blob: Path, pointer: Path) -> None:
    """snapshots/<commit>/<name> -> ../../blobs/<etag>, or a copy where links are refused."""
    pointer, blob = _inside(repo, pointer), _inside(repo, blob)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink():  # a dangling link: its blob was deleted
        pointer.unlink()
    try:
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:
        shutil.copyfile(blob, pointer)
