"""A stand-in for the Hugging Face Hub on localhost (stdlib http.server in a thread), serving
what huggingface_hub and app/hub_download.py ask of it, the way the Hub answers:

  GET  /api/models/{repo}[/revision/{rev}]   model info with siblings (sizes, blob ids, LFS)
  HEAD /{repo}/resolve/{rev}/{file}           X-Repo-Commit, ETag, Content-Length; for LFS files
                                              a 302 to the CDN with X-Linked-Etag/-Size
  GET  /{repo}/resolve/{rev}/{file}           the bytes (small files) or the same 302 (LFS)
  GET  /cdn/{etag}                            LFS bytes, honouring `Range: bytes=N-` with a 206
Errors carry X-Error-Code (RepoNotFound, GatedRepo, EntryNotFound) as the Hub's do.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SEND_CHUNK = 16 * 1024


def is_lfs(name: str) -> bool:
    return name.endswith((".safetensors", ".bin", ".onnx", ".gguf"))


class FakeHub:
    """repos: repo id -> {file name: bytes}; gated: repo ids that answer 403 GatedRepo."""

    def __init__(self, repos: dict[str, dict[str, bytes]], gated: tuple[str, ...] = ()) -> None:
        self.repos = repos
        self.gated = set(gated)
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.seconds_per_chunk = 0.0  # slows LFS bodies, for cancelling mid-file
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def commit(self, repo_id: str) -> str:
        return hashlib.sha1(repo_id.encode()).hexdigest()

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

    def model_info(self, repo_id: str) -> dict:
        siblings = []
        for name, data in self.repos[repo_id].items():
            sibling = {"rfilename": name, "size": len(data), "blobId": self.etag(data, name)}
            if is_lfs(name):
                sibling["lfs"] = {"size": len(data), "sha256": self.etag(data, name),
                                  "pointerSize": 134}
            siblings.append(sibling)
        return {"id": repo_id, "modelId": repo_id, "sha": self.commit(repo_id), "private": False,
                "gated": False, "tags": [], "siblings": siblings}


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
            match = api.match(path) or resolve.match(path)
            repo_id = match.group(1) if match else None
            if repo_id in hub.gated:
                return self._error(403, "GatedRepo")
            if repo_id not in hub.repos:
                return self._error(404, "RepoNotFound")
            if match.re is api:
                return self._send(200, json.dumps(hub.model_info(repo_id)).encode(),
                                  {"Content-Type": "application/json"}, body)
            name = match.group(3)
            files = hub.repos[repo_id]
            if name not in files:
                return self._error(404, "EntryNotFound", {"X-Repo-Commit": hub.commit(repo_id)})
            data = files[name]
            headers = {"X-Repo-Commit": hub.commit(repo_id), "ETag": f'"{hub.etag(data, name)}"'}
            if is_lfs(name):
                headers.update({"Location": f"{hub.url}/cdn/{hub.etag(data, name)}",
                                "X-Linked-Etag": f'"{hub.etag(data, name)}"',
                                "X-Linked-Size": str(len(data))})
                return self._send(302, b"", headers, body)
            self._send(200, data, headers, body)

        def _cdn(self, etag: str, body: bool) -> None:
            data = next((d for files in hub.repos.values() for n, d in files.items()
                         if is_lfs(n) and hub.etag(d, n) == etag), None)
            if data is None:
                return self._error(404, "EntryNotFound")
            start = 0
            match = re.match(r"bytes=(\d+)-$", self.headers.get("Range") or "")
            headers = {"ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if match and int(match.group(1)) < len(data):
                start = int(match.group(1))
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self._send(206 if start else 200, data[start:], headers, body, slow=True)

        def _error(self, status: int, code: str, extra: dict | None = None) -> None:
            self._send(status, json.dumps({"error": code}).encode(),
                       {"X-Error-Code": code, "Content-Type": "application/json", **(extra or {})},
                       True)

        def _send(self, status: int, data: bytes, headers: dict, body: bool,
                  slow: bool = False) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not body:
                return
            for i in range(0, len(data), SEND_CHUNK):
                try:
                    self.wfile.write(data[i:i + SEND_CHUNK])
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client cancelled
                if slow and hub.seconds_per_chunk:
                    time.sleep(hub.seconds_per_chunk)

    return Handler
