"""What went wrong with an endpoint, in one sentence and a hint, for the window and the CLI
alike. Server text is quoted only after the API key is scrubbed from it: errors are stored with
the conversation and written to logs."""

from __future__ import annotations

import json

from engine.events import Failed

MAX_SERVER_TEXT = 300


class RemoteError(Exception):
    """A request to an endpoint failed; `failed()` is the event the stream ends with."""

    def __init__(self, error: str, hint: str = "", bad_input: bool = False) -> None:
        super().__init__(error)
        self.error, self.hint, self.bad_input = error, hint, bad_input

    def failed(self) -> Failed:
        return Failed(self.error, self.hint, self.bad_input)


def scrub(text: str, api_key: str | None) -> str:
    """One line, short, and never the key (a server may echo what it was sent)."""
    if api_key:
        text = text.replace(api_key, mask(api_key))
    text = " ".join(text.split())
    return text if len(text) <= MAX_SERVER_TEXT else text[:MAX_SERVER_TEXT - 1] + "…"


def mask(api_key: str) -> str:
    """How a key is shown: never whole; its last four characters only when it is long enough
    that they give nothing away."""
    return "••••••••" + (api_key[-4:] if len(api_key) >= 16 else "")


def server_message(body: bytes) -> str:
    """The message of an OpenAI-style error body ({"error": {"message": ...}}), FastAPI's
    {"detail": ...}, or the start of whatever text it is."""
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(obj, dict):
        error = obj.get("error", obj)
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(error.get(key), str):
                    return error[key]
        if isinstance(error, str):
            return error
        if isinstance(obj.get("detail"), str):
            return obj["detail"]
    return text.strip()


def unreachable(where: str, reason: str) -> RemoteError:
    return RemoteError(f"Cannot reach the endpoint at {where}: {reason}.",
                       "Check that its server is running and that the URL and port are right.")


def http_error(status: int, body: bytes, where: str, model: str | None, api_key: str | None,
               asking: str) -> RemoteError:
    """`asking`: "models" (the list) or "chat" (an answer)."""
    said = scrub(server_message(body), api_key).rstrip(".")
    quoted = f": {said}" if said else ""
    if status in (401, 403):
        if not api_key:
            return RemoteError(f"The endpoint at {where} needs an API key (HTTP {status}).",
                               "Add the endpoint again with its key.", bad_input=True)
        return RemoteError(f"The endpoint at {where} refused the API key (HTTP {status}).",
                           "Check the key, then add the endpoint again with the right one.",
                           bad_input=True)
    if status == 404 and asking == "chat":
        return RemoteError(f"The endpoint at {where} does not serve the model {model} "
                           f"(HTTP 404{quoted}).",
                           "It may have been taken down: choose another of its models.",
                           bad_input=True)
    if status == 404:
        return RemoteError(f"{where} has no OpenAI-compatible model list (HTTP 404).",
                           "The base URL usually ends in /v1, e.g. http://host:8000/v1.",
                           bad_input=True)
    if status == 429:
        return RemoteError(f"The endpoint at {where} is busy or over its limit (HTTP 429"
                           f"{quoted}).", "Wait a moment and try again.")
    if 400 <= status < 500:
        return RemoteError(f"The endpoint at {where} refused the request (HTTP {status}"
                           f"{quoted}).", bad_input=True)
    return RemoteError(f"The endpoint at {where} failed (HTTP {status}{quoted}).",
                       "The server's own log says more; try again.")
