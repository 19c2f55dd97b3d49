"""Running the app under uvicorn, in-process, one worker: the socket is bound before the model
loads (a port in use fails at once), `serving on http://HOST:PORT/v1` goes to stderr once it
listens, and SIGINT/SIGTERM cancel every request and stop cleanly.
"""

from __future__ import annotations

import errno
import ipaddress
import signal
import socket
import sys
import threading

import uvicorn

from engine.events import BadRequest
from engine.server.connections import limited_protocol

SHUTDOWN_GRACE_S = 5  # open streams end within a step of the cancel; this bounds the rest


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def bind(host: str, port: int) -> socket.socket:
    """A bound socket (not yet listening); BadRequest for a port in use or a foreign address."""
    try:
        family = socket.AF_INET6 if isinstance(ipaddress.ip_address(host.strip("[]")),
                                               ipaddress.IPv6Address) else socket.AF_INET
    except ValueError:
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        except socket.gaierror:
            raise BadRequest(f"cannot resolve --host {host!r} to an address") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restarts
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise BadRequest(f"port {port} on {host} is in use; choose another --port") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise BadRequest(f"binding port {port} needs privileges; choose a --port above "
                             "1023") from None
        raise BadRequest(f"cannot bind {host}:{port}: {e.strerror or e}") from None
    return sock


class Server(uvicorn.Server):
    """uvicorn's server, announcing itself once it listens and cancelling every request on a
    stop signal (so the streams end and the graceful shutdown is short)."""

    def __init__(self, config: uvicorn.Config, engine, announce: bool = True):
        super().__init__(config)
        self.engine, self.announce = engine, announce
        self.ready = threading.Event()

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            if self.announce:
                host, port = sockets[0].getsockname()[:2]
                print(f"serving on http://{url_host(host)}:{port}/v1", file=sys.stderr,
                      flush=True)
            self.ready.set()

    def handle_exit(self, sig: int, frame) -> None:
        # not uvicorn's: it re-raises the signal after shutdown, which would end the process
        # by SIGTERM or KeyboardInterrupt instead of returning
        self.engine.cancel()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


def make_server(app, engine, announce: bool = True) -> Server:
    """uvicorn over `app`, with the connection timeouts of its settings (server/connections.py)."""
    timeouts = app.state.settings.timeouts
    config = uvicorn.Config(app, log_level="warning", workers=1, lifespan="off",
                            timeout_graceful_shutdown=SHUTDOWN_GRACE_S, access_log=False,
                            http=limited_protocol(timeouts, app.state.metrics.stalled.inc),
                            timeout_keep_alive=timeouts.idle_s)
    return Server(config, engine, announce)


class BackgroundServer:
    """The server on a thread of this process (tests, the app's own server): start, url, stop."""

    def __init__(self, app, engine, sock: socket.socket):
        self.sock, self.engine, self.app = sock, engine, app
        self.server = make_server(app, engine, announce=False)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name="hearth-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{url_host(host)}:{port}/v1"

    def start(self, timeout_s: float = 30) -> BackgroundServer:
        self.thread.start()
        if not self.server.ready.wait(timeout_s):
            raise RuntimeError("the server did not start")
        return self

    def stop(self) -> None:
        self.engine.cancel()
        self.server.should_exit = True
        self.thread.join(SHUTDOWN_GRACE_S + 5)
        self.sock.close()
        self.app.state.mailbox.close()
