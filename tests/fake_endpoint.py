"""A fake OpenAI-compatible endpoint: the standard library's http.server on 127.0.0.1 in a
thread, serving GET /v1/models and POST /v1/chat/completions streamed as OpenAI streams it
(HTTP/1.1 chunked SSE; a role chunk first, one id throughout, content deltas, a finish_reason
chunk, a usage chunk when asked, `data: [DONE]`). Modes for what goes wrong:
  api_key set      a request without that Bearer key gets 401 (its body echoes the key sent,
                   as a careless server might: Hearth must scrub it)
  unknown model    404 in OpenAI's error shape (also after `models` is changed: a vanished one)
  mode="error_chunk"  an error chunk after `fail_after` deltas, then [DONE]
  mode="cut"       the connection drops after `fail_after` deltas, mid chunked body
  mode="stall"     the role chunk, then nothing until the client goes (or the server stops)
  mode="endless"   content deltas without end, whatever max_tokens says, until the client goes
  mode="long_line" after `fail_after` deltas, one `data:` line that never ends
  mode="long_event"  after `fail_after` deltas, `data:` lines without the blank line that
                   ends an event
  closed_port_url()  a base URL nothing listens on
The endless modes make their bytes as the client reads them, and give up after FLOOD_CAP_BYTES
(`sent_bytes` counts what went out): a client that stops reading stops the flood.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = ("Hello", "!", " I", " am", " a", " fake", " model", " on", " a", " cluster", ".")
CHUNK_ID = "chatcmpl-9fAkE0penAIcompat1ble"
CREATED = 1_733_000_000
FLOOD_CAP_BYTES = 64 << 20  # an endless mode's end, should a client never stop reading
FLOOD_PIECE = 64 << 10


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up (a cancelled stream, or a socket closed with the last chunk unread,
    which the kernel answers with a reset) is normal for a server; socketserver would print its
    traceback to stderr, where the CLI tests look for tracebacks of their own."""

    def handle_error(self, request, client_address) -> None:
        import sys
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class FakeEndpoint:
    def __init__(self, models=("fake-7b", "fake-70b"), api_key: str | None = None,
                 answer=ANSWER, mode: str = "ok", fail_after: int = 3, delay_s: float = 0.0,
                 contexts: dict[str, int] | None = None) -> None:
        self.models = list(models)
        self.api_key = api_key
        self.answer = tuple(answer)
        self.mode = mode
        self.fail_after = fail_after
        self.delay_s = delay_s
        self.contexts = dict(contexts or {})  # model -> max_model_len, as vLLM lists it
        self.requests: list[dict] = []  # {"path", "headers", "body"} of each request
        self.sent_bytes = 0  # of the streams' bodies, all requests together
        self.stopping = threading.Event()
        self._server = _QuietServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def chat_requests(self) -> list[dict]:
        return [r["body"] for r in self.requests if r["path"].endswith("/chat/completions")]

    def start(self) -> FakeEndpoint:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeEndpoint:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()


def closed_port_url() -> str:
    """A base URL on a port that was free a moment ago: connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def chunk(model: str, delta: dict, finish_reason: str | None = None, usage=None,
          choices: bool = True) -> dict:
    """One chat.completion.chunk, field for field as OpenAI sends it."""
    body = {"id": CHUNK_ID, "object": "chat.completion.chunk", "created": CREATED,
            "model": model, "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason}] if choices else [],
            "usage": usage}
    return body


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args) -> None:  # quiet tests
        pass

    @property
    def fake(self) -> FakeEndpoint:
        return self.server.fake

    # ------------------------------------------------------------------ routes

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self._record(None)
        if not self._authorized():
            return
        if self.path.rstrip("/") != "/v1/models":
            return self._error(404, f"Not found: {self.path}", "NotFoundError")
        data = [{"id": m, "object": "model", "created": CREATED, "owned_by": "fake",
                 **({"max_model_len": self.fake.contexts[m]} if m in self.fake.contexts else {})}
                for m in self.fake.models]
        self._json(200, {"object": "list", "data": data})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self._record(body)
        if not self._authorized():
            return
        if self.path != "/v1/chat/completions":
            return self._error(404, f"Not found: {self.path}", "NotFoundError")
        model = body.get("model")
        if model not in self.fake.models:
            return self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
        self._stream(body)

    # ------------------------------------------------------------------ the stream

    def _stream(self, body: dict) -> None:
        fake, model = self.fake, body["model"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._event(chunk(model, {"role": "assistant", "content": "", "refusal": None}))
        if fake.mode == "stall":
            while not fake.stopping.wait(0.05) and self._client_is_there():
                pass
            self.close_connection = True
            return
        if fake.mode == "endless":
            return self._flood(lambda: self._event_bytes(chunk(model, {"content": " again"})))
        pieces = fake.answer[:body.get("max_tokens") or len(fake.answer)]
        for i, piece in enumerate(pieces):
            if i == fake.fail_after and fake.mode == "cut":
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)  # no closing chunk: a cut body
                self.close_connection = True
                return
            if i == fake.fail_after and fake.mode == "error_chunk":
                self._event({"error": {"object": "error", "message": "CUDA out of memory on "
                             "worker 3", "type": "InternalServerError", "param": None,
                             "code": 500}})
                return self._done()
            if i == fake.fail_after and fake.mode == "long_line":
                self._write_chunk(b"data: ")
                return self._flood(lambda: b"x" * FLOOD_PIECE)
            if i == fake.fail_after and fake.mode == "long_event":
                return self._flood(lambda: b"data: " + b"x" * FLOOD_PIECE + b"\n")
            time.sleep(fake.delay_s)
            self._event(chunk(model, {"content": piece}))
        reason = "length" if len(pieces) < len(fake.answer) else "stop"
        self._event(chunk(model, {}, reason))
        if (body.get("stream_options") or {}).get("include_usage"):
            prompt = sum(len(m["content"].split()) for m in body["messages"]) + 5
            self._event(chunk(model, {}, usage={"prompt_tokens": prompt,
                                                "completion_tokens": len(pieces),
                                                "total_tokens": prompt + len(pieces)},
                              choices=False))
        self._done()

    def _event(self, obj: dict) -> None:
        self._write_chunk(self._event_bytes(obj))

    @staticmethod
    def _event_bytes(obj: dict) -> bytes:
        return f"data: {json.dumps(obj)}\n\n".encode()

    def _flood(self, piece) -> None:
        """`piece()` after piece until the client goes or FLOOD_CAP_BYTES went out."""
        start = self.fake.sent_bytes
        while self.fake.sent_bytes - start < FLOOD_CAP_BYTES and self._write_chunk(piece()):
            pass
        self.close_connection = True

    def _done(self) -> None:
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")  # the last chunk of the chunked body

    def _write_chunk(self, data: bytes) -> bool:
        """-> whether it went out (False: the client is gone)."""
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
            self.fake.sent_bytes += len(data)
            return True
        except OSError:  # the client went away (a stop): nothing more to send
            self.close_connection = True
            return False

    def _client_is_there(self) -> bool:
        try:
            self.connection.setblocking(False)
            try:
                return self.connection.recv(1, socket.MSG_PEEK) != b""
            finally:
                self.connection.setblocking(True)
        except BlockingIOError:
            return True
        except OSError:
            return False

    # ------------------------------------------------------------------ helpers

    def _record(self, body) -> None:
        self.fake.requests.append({"path": self.path, "headers": dict(self.headers),
                                   "body": body})

    def _authorized(self) -> bool:
        if self.fake.api_key is None:
            return True
        sent = self.headers.get("Authorization", "")
        if sent == f"Bearer {self.fake.api_key}":
            return True
        self._error(401, f"Incorrect API key provided: {sent.removeprefix('Bearer ')}",
                    "invalid_request_error")
        return False

    def _error(self, status: int, message: str, kind: str) -> None:
        self._json(status, {"error": {"message": message, "type": kind, "param": None,
                                      "code": status}})

    def _json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
