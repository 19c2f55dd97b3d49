"""A stand-in for the Hugging Face Hub on localhost (stdlib http.server in a thread), serving
what huggingface_hub and engine/files/hub_download.py ask of it, the way the Hub answers:

  GET  /api/models?search=WORDS               search: ids holding the words, most downloaded first
  GET  /api/models/{repo}[/revision/{rev}]   model info with siblings (sizes, blob ids, LFS)
  HEAD /{repo}/resolve/{rev}/{file}           X-Repo-Commit, ETag, Content-Length; for LFS files
                                              a 302 to the CDN with X-Linked-Etag/-Size
  GET  /{repo}/resolve/{rev}/{file}           the bytes (small files) or the same 302 (LFS)
  GET  /cdn/{etag}                            LFS bytes, honouring `Range: bytes=N-` with a 206
Errors carry X-Error-Code (RepoNotFound, GatedRepo, EntryNotFound) as the Hub's do.
A hostile Hub lies where it is told to: `commit`, `endless_listing`, and per file a `Lie`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

SEND_CHUNK = 16 * 1024
ENDLESS = object()  # a body that never ends
BODY_LENGTH = object()  # _send's default Content-Length: the body's own


@dataclass
class Lie:
    """What a hostile Hub says about one file instead of the truth (None: the truth)."""
    etag: str | None = None  # the ETag (and X-Linked-Etag) it answers with
    size: int | None = None  # the size it declares in the listing and the file's headers
    no_size: bool = False  # declares no size anywhere, and sends no Content-Length
    body: bytes | object | None = None  # what it streams instead (ENDLESS: without end)
    announced: int | None = None  # the Content-Length its CDN sends with an ENDLESS body


def is_lfs(name: str) -> bool:
    return name.endswith((".safetensors", ".bin", ".onnx", ".gguf"))


class FakeHub:
    """repos: repo id -> {file name: bytes}; gated: repo ids that answer 403 GatedRepo."""

    def __init__(self, repos: dict[str, dict[str, bytes]], gated: tuple[str, ...] = ()) -> None:
        self.repos = repos
        self.gated = set(gated)
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.seconds_per_chunk = 0.0  # slows LFS bodies, for cancelling mid-file
        self.commit_id: str | None = None  # the revision it names instead of the real one
        self.endless_listing = False  # the model info never ends
        self.lies: dict[str, Lie] = {}  # file name -> what it says instead
        self.downloads: dict[str, int] = {}  # repo id -> the download count a search shows
        self.search_answer: bytes | None = None  # what a search answers instead of the truth
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def commit(self, repo_id: str) -> str:
        return self.commit_id or hashlib.sha1(repo_id.encode()).hexdigest()

    def declared_size(self, name: str, data: bytes) -> int | None:
        lie = self.lies.get(name, Lie())
        return None if lie.no_size else lie.size if lie.size is not None else len(data)

    def served_etag(self, data: bytes, name: str) -> str:
        return self.lies.get(name, Lie()).etag or self.etag(data, name)

    def body(self, data: bytes, name: str) -> bytes | object:
        lie = self.lies.get(name, Lie())
        return data if lie.body is None else lie.body

    def etag(self, data: bytes, name: str) -> str:
        # the Hub's ETag is the sha256 for LFS files and the git blob id otherwise
        if is_lfs(name):
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def search(self, query: str, limit: int) -> list[dict]:
        """As the Hub's /api/models?search=: every word in the id, case-insensitive."""
        words = query.lower().split()
        found = sorted((r for r in self.repos if all(w in r.lower() for w in words)),
                       key=lambda r: -self.downloads.get(r, 0))
        out = []
        for repo_id in found[:limit]:
            weights = sum(len(d) for n, d in self.repos[repo_id].items()
                          if n.endswith(".safetensors"))
            out.append({"id": repo_id, "modelId": repo_id, "downloads": self.downloads.get(
                repo_id, 0), "likes": 1, "safetensors": {"parameters": {"BF16": weights // 2},
                                                          "total": weights // 2}})
        return out

    def model_info(self, repo_id: str) -> dict:
        siblings = []
        for name, data in self.repos[repo_id].items():
            size = self.declared_size(name, data)
            sibling = {"rfilename": name, "blobId": self.etag(data, name)}
            if size is not None:
                sibling["size"] = size
                if is_lfs(name):
                    sibling["lfs"] = {"size": size, "sha256": self.etag(data, name),
                                      "pointerSize": 134}
            siblings.append(sibling)
        return {"id": repo_id, "modelId": repo_id, "sha": self.commit(repo_id), "private": False,
                "gated": False, "tags": [], "siblings": siblings}


@contextmanager
def serving(repos: dict[str, dict[str, bytes]], monkeypatch, **kwargs) -> Iterator[FakeHub]:
    """A FakeHub that huggingface_hub and Hearth's hub code talk to (HF_ENDPOINT), with the
    test session's offline mode (tests/conftest.py) lifted for it alone."""
    import huggingface_hub.constants

    with FakeHub(repos, **kwargs) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        # belt and braces: a call that forgot the endpoint still stays on localhost
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.url + "/{repo_id}/resolve/{revision}/{filename}")
        yield hub


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _handler(hub: FakeHub):
    api = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/revision/[^/]+)?$")
    resolve = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args) -> None:
            pass

        def do_HEAD(self) -> None:  # noqa: N802 (http.server's name)
            self._answer(body=False)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = self.path.split("?")[0]
            hub.requests.append((self.command, path, self.headers.get("Range")))
            if path.startswith("/cdn/"):
                return self._cdn(path.removeprefix("/cdn/"), body)
            if path == "/api/models":
                query = parse_qs(self.path.partition("?")[2])
                answer = hub.search_answer or json.dumps(hub.search(
                    query.get("search", [""])[0], int(query.get("limit", ["20"])[0]))).encode()
                return self._send(200, answer, {"Content-Type": "application/json"}, body)
            match = api.match(path) or resolve.match(path)
            repo_id = match.group(1) if match else None
            if repo_id in hub.gated:
                return self._error(403, "GatedRepo")
            if repo_id not in hub.repos:
                return self._error(404, "RepoNotFound")
            if match.re is api:
                info = ENDLESS if hub.endless_listing else json.dumps(hub.model_info(repo_id))
                return self._send(200, info if info is ENDLESS else info.encode(),
                                  {"Content-Type": "application/json"}, body)
            name = match.group(3)
            files = hub.repos[repo_id]
            if name not in files:
                return self._error(404, "EntryNotFound", {"X-Repo-Commit": hub.commit(repo_id)})
            data = files[name]
            etag, size = hub.served_etag(data, name), hub.declared_size(name, data)
            headers = {"X-Repo-Commit": hub.commit(repo_id), "ETag": f'"{etag}"'}
            if is_lfs(name):
                headers.update({"Location": f"{hub.url}/cdn/{hub.etag(data, name)}",
                                "X-Linked-Etag": f'"{etag}"'})
                if size is not None:
                    headers["X-Linked-Size"] = str(size)
                return self._send(302, b"", headers, body)
            served = hub.body(data, name)
            if not body:  # HEAD declares; GET sends what it sends
                return self._send(200, b"", headers, body, length=size)
            self._send(200, served, headers, body,
                       length=None if size is None or served is ENDLESS else BODY_LENGTH)

        def _cdn(self, etag: str, body: bool) -> None:
            found = next(((n, d) for files in hub.repos.values() for n, d in files.items()
                          if is_lfs(n) and hub.etag(d, n) == etag), None)
            if found is None:
                return self._error(404, "EntryNotFound")
            name, data = found
            if not body:  # huggingface_hub follows a redirect on the same host: lie here too
                headers = {"ETag": f'"{hub.served_etag(data, name)}"', "Accept-Ranges": "bytes"}
                return self._send(200, b"", headers, body, length=hub.declared_size(name, data))
            served = hub.body(data, name)
            if served is ENDLESS:
                return self._send(200, ENDLESS, {"ETag": f'"{etag}"'}, body,
                                  length=hub.lies.get(name, Lie()).announced)
            start = 0
            match = re.match(r"bytes=(\d+)-$", self.headers.get("Range") or "")
            headers = {"ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if match and int(match.group(1)) < len(served):
                start = int(match.group(1))
                headers["Content-Range"] = f"bytes {start}-{len(served) - 1}/{len(served)}"
            length = None if hub.lies.get(name, Lie()).no_size else len(served) - start
            self._send(206 if start else 200, served[start:], headers, body, slow=True,
                       length=length)

        def _error(self, status: int, code: str, extra: dict | None = None) -> None:
            self._send(status, json.dumps({"error": code}).encode(),
                       {"X-Error-Code": code, "Content-Type": "application/json", **(extra or {})},
                       True)

        def _send(self, status: int, data: bytes | object, headers: dict, body: bool,
                  slow: bool = False, length: int | None | object = BODY_LENGTH) -> None:
            """length: the Content-Length sent (by default the body's; None: none, and the
            body ends when the connection closes, as HTTP/1.0 allows)."""
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            if length is BODY_LENGTH:
                length = None if data is ENDLESS else len(data)
            if length is not None:
                self.send_header("Content-Length", str(length))
            self.end_headers()
            if not body:
                return
            chunks = (iter(lambda: b"\x00" * SEND_CHUNK, None) if data is ENDLESS else
                      (data[i:i + SEND_CHUNK] for i in range(0, len(data), SEND_CHUNK)))
            for chunk in chunks:
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client cancelled, or stopped a stream that ran too long
                if slow and hub.seconds_per_chunk:
                    time.sleep(hub.seconds_per_chunk)

    return Handler
