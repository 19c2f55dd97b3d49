"""An endpoint's base URL: checked and normalized before any request is made, so a typo is one
sentence (exit 2) rather than a network error. The base is what OpenAI clients call base_url:
the part before /models and /chat/completions, usually ending in /v1."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from engine.events import BadRequest

MAX_URL_CHARS = 2048


@dataclass(frozen=True)
class BaseUrl:
    scheme: str  # "http" or "https"
    host: str
    port: int
    path: str  # "/v1", never ending in "/"

    @property
    def text(self) -> str:
        default = 443 if self.scheme == "https" else 80
        port = "" if self.port == default else f":{self.port}"
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        return f"{self.scheme}://{host}{port}{self.path}"

    @property
    def where(self) -> str:
        """Where the model runs, for the window and messages: host[:port]."""
        return self.text.split("://", 1)[1].removesuffix(self.path)


def parse_base_url(text: str) -> BaseUrl:
    """BadRequest with one sentence for anything that is not an http(s) base URL."""
    text = (text or "").strip()
    if not text:
        raise BadRequest("give the endpoint's base URL, e.g. http://gpu-box:8000/v1")
    if len(text) > MAX_URL_CHARS or any(c.isspace() or ord(c) < 32 for c in text):
        raise BadRequest("the endpoint URL must be one line, without spaces, of at most "
                         f"{MAX_URL_CHARS:,} characters")
    if "://" not in text:
        text = "http://" + text  # "gpu-box:8000/v1", as people type it
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise BadRequest(f"the endpoint URL {text[:80]!r} is not a valid URL ({e})") from None
    if parts.scheme not in ("http", "https"):
        raise BadRequest(f"the endpoint URL must start with http:// or https://, not "
                         f"{parts.scheme}://")
    if not parts.hostname:
        raise BadRequest(f"the endpoint URL {text[:80]!r} names no host")
    if parts.username or parts.password:
        # a key in the URL would end up in settings and logs: it has a field of its own
        raise BadRequest("put the API key in its own field (--api-key), not in the URL")
    if parts.query or parts.fragment:
        raise BadRequest("the endpoint URL is a base URL such as http://host:8000/v1, without "
                         "?query or #fragment")
    path = parts.path.rstrip("/")
    for tail in ("/chat/completions", "/models"):  # a full endpoint URL pasted as the base
        path = path.removesuffix(tail)
    default = 443 if parts.scheme == "https" else 80
    return BaseUrl(parts.scheme, parts.hostname, port or default, path)
