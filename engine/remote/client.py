"""The OpenAI-compatible client: GET {base}/models, and POST {base}/chat/completions streamed
as server-sent events, over the standard library's http.client (no torch: the window uses it
too). Failures are RemoteError from list_models and a closing Failed from stream_chat."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass

from engine.events import BadRequest, Failed, GenerateRequest
from engine.remote.answer_stream import AnswerStream
from engine.remote.base_url import BaseUrl, parse_base_url
from engine.remote.cancel import CancelToken
from engine.remote.failures import RemoteError, http_error, unreachable
from engine.remote.sse import ServerEvent, SseOverflow, SseReader, size_text

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 300.0  # a busy cluster may queue a request for minutes before its first token
MAX_LINE_BYTES = 1 << 20  # a line of a stream; an event is bounded in sse.py
MAX_BODY_BYTES = 8 << 20  # a model list or a whole (non-streamed) answer
MAX_ERROR_BYTES = 64 << 10
CONTEXT_KEYS = ("max_model_len", "context_length", "context_window")  # vLLM, LM Studio, others


@dataclass(frozen=True)
class RemoteModel:
    id: str
    context: int = 0  # tokens, where the server says (vLLM's max_model_len); 0: not said


def check_api_key(api_key: str | None) -> None:
    """A key goes into an HTTP header: one line of printable ASCII."""
    if api_key and not (api_key.isascii() and api_key.isprintable() and " " not in api_key):
        raise BadRequest("the API key must be one line of printable ASCII characters, without "
                         "spaces")


def list_models(base_url: str, api_key: str | None = None,
                timeout_s: float = CONNECT_TIMEOUT_S) -> list[RemoteModel]:
    """The models the endpoint serves, as its /models lists them. RemoteError on any failure
    (BadRequest for a malformed URL or key)."""
    base = parse_base_url(base_url)
    check_api_key(api_key)
    conn, _sock = _connect(base, timeout_s)
    try:
        response = _send(conn, base, "GET", "/models", None, api_key)
        if response.status != 200:
            raise http_error(response.status, response.read(MAX_ERROR_BYTES), base.where, None,
                             api_key, "models")
        body = _read_body(response, base.where)
    finally:
        conn.close()
    try:
        listed = json.loads(body).get("data")
        if not isinstance(listed, list):
            raise ValueError
    except (ValueError, AttributeError):
        raise RemoteError(f"The endpoint at {base.where} answered /models with something that "
                          "is not an OpenAI model list.", "Is the base URL right (it usually "
                          "ends in /v1)?", bad_input=True) from None
    models = []
    for item in listed:
        if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"]:
            context = next((v for k in CONTEXT_KEYS if type(v := item.get(k)) is int and v > 0),
                           0)
            models.append(RemoteModel(item["id"], context))
    return models


def check_model(base_url: str, model: str, api_key: str | None = None) -> RemoteModel:
    """The listed model named `model`; RemoteError (bad input) naming those served if absent."""
    models = list_models(base_url, api_key)
    for m in models:
        if m.id == model:
            return m
    where = parse_base_url(base_url).where
    served = ", ".join(m.id for m in models[:8]) + (", …" if len(models) > 8 else "")
    raise RemoteError(f"The endpoint at {where} does not serve {model!r}; it serves "
                      f"{served or 'no models'}.", "Choose one of those.", bad_input=True)


def chat_body(model: str, request: GenerateRequest) -> dict:
    """The /chat/completions request for a Hearth GenerateRequest (BadRequest for what an
    endpoint cannot take: token ids, raw prompts)."""
    if request.prompt_ids is not None or request.raw:
        raise BadRequest("an endpoint takes chat messages: not token ids, not a raw prompt")
    messages = [{"role": m["role"], "content": m["content"]} for m in request.messages or ()]
    if request.prompt is not None:
        messages.append({"role": "user", "content": request.prompt})
    if request.system and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": request.system})
    body = {"model": model, "messages": messages, "stream": True,
            "stream_options": {"include_usage": True},  # token counts in the last chunk
            "max_tokens": request.max_new_tokens}
    s = request.sampling
    # top_k and repetition_penalty are vLLM's, SGLang's and Ollama's extensions: sent only
    # when chosen, so a strict server is not refused a default
    for key, value in (("temperature", s.temperature), ("top_p", s.top_p), ("seed", s.seed),
                       ("top_k", s.top_k), ("repetition_penalty", s.repetition_penalty)):
        if value is not None:
            body[key] = value
    if request.stop:
        body["stop"] = list(request.stop)
    return body


def stream_chat(base_url: str, model: str, request: GenerateRequest, *,
                api_key: str | None = None, cancel: CancelToken | None = None,
                read_timeout_s: float = READ_TIMEOUT_S) -> Iterator:
    """Stream one answer from an OpenAI-compatible endpoint as Hearth's events: Token (text,
    no ids), Stats a few times a second, and exactly one Finished or Failed, last. Never raises
    for the network or the server; `cancel.cancel()` from any thread ends it with
    Finished("cancelled") at once, even while a read is blocked."""
    cancel = cancel or CancelToken()
    try:
        base = parse_base_url(base_url)
        check_api_key(api_key)
        body = json.dumps(chat_body(model, request), ensure_ascii=False).encode("utf-8")
    except BadRequest as e:
        yield Failed(str(e), bad_input=True)
        return
    # the limit is sent, and held here too: a server that ignores it is cut off at it
    answer = AnswerStream(base.where, time.monotonic(), api_key, request.max_new_tokens)
    conn = None
    try:
        conn, sock = _connect(base, CONNECT_TIMEOUT_S)
        cancel.on_cancel(lambda: _abort(sock))
        sock.settimeout(read_timeout_s)
        response = _send(conn, base, "POST", "/chat/completions", body, api_key)
        if response.status != 200:
            raise http_error(response.status, response.read(MAX_ERROR_BYTES), base.where, model,
                             api_key, "chat")
        events = (_whole_answer(response, base.where) if _is_whole(response)
                  else _server_events(response, cancel))
        cut_reason = ""
        try:
            for event in events:
                yield from answer.feed(event, time.monotonic())
                if answer.is_over or cancel.is_cancelled:
                    break
        except SseOverflow as e:
            answer.refuse(f"sent {e}")
        except TimeoutError:
            cut_reason = f"nothing came for {read_timeout_s:g} s"
        except (OSError, http.client.HTTPException) as e:
            cut_reason = _cut_reason(e)
    except RemoteError as e:
        if cancel.is_cancelled:
            yield from answer.end(is_cancelled=True)
        else:
            yield e.failed()
        return
    finally:
        if conn is not None:
            conn.close()
    yield from answer.end(is_cancelled=cancel.is_cancelled, cut_reason=cut_reason)


# ---------------------------------------------------------------- transport


def _connect(base: BaseUrl, timeout_s: float) -> tuple[http.client.HTTPConnection, socket.socket]:
    cls = http.client.HTTPSConnection if base.scheme == "https" else http.client.HTTPConnection
    conn = cls(base.host, base.port, timeout=timeout_s)
    try:
        conn.connect()
    except socket.gaierror:
        raise unreachable(base.where, "its host name is not known") from None
    except ConnectionRefusedError:
        raise unreachable(base.where, "the connection was refused") from None
    except TimeoutError:
        raise unreachable(base.where, f"no answer within {timeout_s:g} s") from None
    except ssl.SSLError as e:
        raise RemoteError(f"The secure connection to {base.where} failed: "
                          f"{e.reason or e.__class__.__name__}.",
                          "Check the URL's scheme (http or https) and the server's "
                          "certificate.") from None
    except OSError as e:
        raise unreachable(base.where, e.strerror or e.__class__.__name__) from None
    # held here: http.client lets go of conn.sock once a response will close the connection
    return conn, conn.sock


def _send(conn, base: BaseUrl, method: str, path: str, body: bytes | None,
          api_key: str | None) -> http.client.HTTPResponse:
    headers = {"Accept": "application/json, text/event-stream", "User-Agent": "hearth"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        conn.request(method, base.path + path, body=body, headers=headers)
        return conn.getresponse()
    except TimeoutError:
        raise unreachable(base.where, "it accepted the connection but did not answer") from None
    except (OSError, http.client.HTTPException) as e:
        raise unreachable(base.where, f"the connection dropped ({_cut_reason(e)})") from None


def _abort(sock: socket.socket) -> None:
    """Unblock a read in another thread: shutdown wakes it, close alone may not."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def _read_body(response, where: str) -> bytes:
    try:
        body = response.read(MAX_BODY_BYTES + 1)
    except (OSError, http.client.HTTPException) as e:
        raise unreachable(where, f"the connection dropped ({_cut_reason(e)})") from None
    if len(body) > MAX_BODY_BYTES:
        raise RemoteError(f"The endpoint at {where} sent more than {MAX_BODY_BYTES >> 20} MiB "
                          "where a short JSON answer was due.")
    return body


def _is_whole(response) -> bool:
    """A server that ignored stream=true and sent the whole answer as JSON."""
    kind = (response.getheader("Content-Type") or "").lower()
    return "json" in kind and "event-stream" not in kind


def _server_events(response, cancel: CancelToken) -> Iterator[ServerEvent]:
    reader = SseReader()
    while not cancel.is_cancelled:
        line = response.readline(MAX_LINE_BYTES + 1)
        if not line:
            break
        if len(line) > MAX_LINE_BYTES:
            raise SseOverflow(f"a line longer than {size_text(MAX_LINE_BYTES)}")
        event = reader.feed(line)
        if event is not None:
            yield event
    event = reader.flush()  # a last event without its blank line
    if event is not None and not cancel.is_cancelled:
        yield event


def _whole_answer(response, where: str) -> Iterator[ServerEvent]:
    """The one chat.completion object, fed to the stream as if it were one chunk."""
    try:
        obj = json.loads(_read_body(response, where))
        choice = obj["choices"][0]
        chunk = {"choices": [{"index": 0, "delta": {"content": choice["message"]["content"]},
                              "finish_reason": choice.get("finish_reason")}],
                 "usage": obj.get("usage")}
    except (ValueError, KeyError, IndexError, TypeError):
        yield ServerEvent("message", "not a chat.completion")  # fails as "not an OpenAI chunk"
        return
    except RemoteError as e:
        yield ServerEvent("error", json.dumps({"error": {"message": e.error}}))
        return
    yield ServerEvent("message", json.dumps(chunk))


def _cut_reason(e: BaseException) -> str:
    if isinstance(e, (http.client.IncompleteRead, http.client.RemoteDisconnected)):
        return "the server closed it"
    if isinstance(e, ConnectionResetError):
        return "the connection was reset"
    return getattr(e, "strerror", None) or e.__class__.__name__
