"""Time limits on each HTTP connection, which uvicorn's own protocol does not keep: a client must
send a whole request (headers and body) within the idle timeout of connecting or of its last
answer (an idle keep-alive, a half-open connection, a request sent a byte at a time), and must
read what the server writes: once the server's send buffer stays full for the stall timeout,
the connection is reset, and the answer's stream, told that its client left, cancels its
request in the engine, which frees its place in the batch and its KV blocks. The send buffer
is bounded too (the kernel's would grow to megabytes, a whole long answer, and hide the stall).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass

STALL_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 30.0
# a connection's unread output: the kernel's part (Linux doubles it) and the transport's; 64 KiB
# in flight still carries a stream of 8 choices across a link with a 200 ms round trip
KERNEL_SEND_BYTES = 32 << 10
TRANSPORT_SEND_BYTES = 32 << 10


@dataclass(frozen=True)
class Timeouts:
    stall_s: float = STALL_TIMEOUT_S  # a client that reads nothing of an answer this long
    idle_s: float = IDLE_TIMEOUT_S  # a connection without a whole request this long


class _Limits:
    """Both timers, over uvicorn's HTTP/1.1 protocol (H11Protocol, which the class that
    `limited_protocol` makes puts after this one); that class holds the settings, as uvicorn
    builds its protocol from the class alone. Importing this module does not import uvicorn."""

    timeouts = Timeouts()
    on_stall: Callable[[], None] = staticmethod(lambda: None)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._idle: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, KERNEL_SEND_BYTES)
        transport.set_write_buffer_limits(high=TRANSPORT_SEND_BYTES)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._idle = _cancelled(self._idle)
        self._stall = _cancelled(self._stall)
        super().connection_lost(exc)

    # ------------------------------------------------------------------ reading a request

    def _arm_idle(self) -> None:
        _cancelled(self._idle)
        self._idle = self.loop.call_later(self.timeouts.idle_s, self._idle_expired)

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and not cycle.more_body and not cycle.response_complete:
            self._idle = _cancelled(self._idle)  # a whole request: the app answers it now

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_idle()  # uvicorn's keep-alive timer ends with the next byte; this does not

    def _idle_expired(self) -> None:
        self._idle = None
        self.transport.abort()

    # ------------------------------------------------------------------ writing an answer

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            self._stall = self.loop.call_later(self.timeouts.stall_s, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stall = _cancelled(self._stall)

    def _stalled(self) -> None:
        self._stall = None
        self.on_stall()
        # abort, not close: close would wait for the unread bytes to go out, which they never do
        self.transport.abort()


def _cancelled(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


def limited_protocol(timeouts: Timeouts, on_stall: Callable[[], None]) -> type:
    """The protocol class for uvicorn.Config(http=...): these timeouts; `on_stall()` runs on
    the event loop as a stalled connection is reset."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return type("LimitedH11Protocol", (_Limits, H11Protocol),
                {"timeouts": timeouts, "on_stall": staticmethod(on_stall)})
