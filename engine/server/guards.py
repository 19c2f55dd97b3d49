"""The server's safe defaults as ASGI middleware: the Host header check (DNS rebinding), the
key on every route but /health (as a Bearer token, or in `x-api-key` as Anthropic's clients send
it), and a bound on the request body. Each refusal is in the shape of the route's protocol.
"""

from __future__ import annotations

import hmac
import ipaddress
import json

from engine.server.errors import shaped_body

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses: where no key is needed."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def host_name(header: str) -> str:
    """The name of a Host header without its port: "[::1]:8000" -> "::1"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


async def _answer(scope, send, status: int, message: str, code: str, headers=()) -> None:
    body = json.dumps(shaped_body(scope.get("path", ""), status, message, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class HostCheck:
    """Only the bound address and localhost names may appear as the Host: a web page whose DNS
    name was rebound to 127.0.0.1 sends its own name and is refused. Bound to every interface,
    any IP literal is accepted too (rebinding needs a DNS name), and the machine's own names."""

    def __init__(self, app, bound_host: str, extra_names: tuple[str, ...] = ()):
        self.app = app
        bound = bound_host.strip("[]").lower()
        self.wildcard = bound in WILDCARDS
        self.allowed = {*LOCAL_NAMES, bound, *(n.lower() for n in extra_names)}

    def allows(self, header: str | None) -> bool:
        if not header:
            return False
        name = host_name(header)
        return name in self.allowed or (self.wildcard and _is_ip(name))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        header = dict(scope.get("headers", ())).get(b"host", b"").decode("latin-1")
        if not self.allows(header):
            return await _answer(scope, send, 403, f"the Host header {header[:100]!r} is not this "
                                 "server's address", "invalid_host")
        await self.app(scope, receive, send)


class BearerAuth:
    """`Authorization: Bearer KEY` or `x-api-key: KEY` on every route but /health (and CORS
    preflights, which a browser sends without it; the CORS middleware outside this one answers
    them)."""

    OPEN = ("/health",)

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.key is None or scope["path"] in self.OPEN:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        header = headers.get(b"authorization", b"")
        scheme, _, given = header.partition(b" ")
        if b"x-api-key" in headers and not header:
            scheme, given = b"bearer", headers[b"x-api-key"]
        if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
            message = ("no API key given: send `Authorization: Bearer KEY` or `x-api-key: KEY`"
                       if not (header or b"x-api-key" in headers) else "the API key is wrong")
            return await _answer(scope, send, 401, message, "invalid_api_key",
                                 [(b"www-authenticate", b"Bearer")])
        await self.app(scope, receive, send)


class BodyLimit:
    """Reads the whole body up to `max_bytes` (413 past it), then hands it to the app; later
    receives (a disconnect) go through."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await self._too_large(scope, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # gone before the body arrived
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._too_large(scope, send)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope, send):
        await _answer(scope, send, 413, f"the request body is larger than {self.max_bytes:,} bytes "
                      "(the bound follows the model's context)", "body_too_large")
