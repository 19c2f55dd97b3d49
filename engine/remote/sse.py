"""Server-sent events, as the WHATWG spec reads them: `data:` lines gathered until a blank
line, `event:` naming the kind, `:` lines ignored (keep-alives). Nothing OpenAI-specific."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerEvent:
    kind: str  # "message" unless the server said otherwise (`event: error`)
    data: str


class SseReader:
    def __init__(self) -> None:
        self._data: list[str] = []
        self._kind = ""

    def feed(self, line: bytes | str) -> ServerEvent | None:
        """One line of the stream, its line ending optional; the event it completes, if any."""
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        line = line.rstrip("\r\n")
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._kind = value
        return None

    def flush(self) -> ServerEvent | None:
        """The event in progress, at a blank line or at the end of the stream."""
        if not self._data:
            self._kind = ""
            return None
        event = ServerEvent(self._kind or "message", "\n".join(self._data))
        self._data, self._kind = [], ""
        return event
