"""Server-sent events, as the WHATWG spec reads them: `data:` lines gathered until a blank
line, `event:` naming the kind, `:` lines ignored (keep-alives). Nothing OpenAI-specific. An
event is bounded: a server that never sends its blank line cannot grow it without end."""

from __future__ import annotations

from dataclasses import dataclass

MAX_EVENT_BYTES = 1 << 20  # an OpenAI chunk is a few hundred bytes


class SseOverflow(ValueError):
    """A line or an event past its bound; the message says which, as "sent ..."."""


@dataclass(frozen=True)
class ServerEvent:
    kind: str  # "message" unless the server said otherwise (`event: error`)
    data: str


class SseReader:
    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._data: list[str] = []
        self._size = 0  # characters of data gathered for the event in progress
        self._kind = ""
        self._max_event = max_event_bytes

    def feed(self, line: bytes | str) -> ServerEvent | None:
        """One line of the stream, its line ending optional; the event it completes, if any.
        SseOverflow when the event in progress passes its bound."""
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
            self._size += len(value) + 1
            if self._size > self._max_event:
                raise SseOverflow(f"an event longer than {size_text(self._max_event)} "
                                  "without the blank line that ends one")
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
        self._data, self._size, self._kind = [], 0, ""
        return event


def size_text(num_bytes: int) -> str:
    return f"{num_bytes >> 20} MiB" if num_bytes >= 1 << 20 else f"{num_bytes:,} bytes"
