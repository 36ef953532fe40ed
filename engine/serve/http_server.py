"""uvicorn on a socket bound up front: the port is known at once (0 = any free one), a taken port is a clear
error, and the server runs either in the calling thread (the CLI) or in a background thread (the studio)."""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable

import uvicorn

from engine.errors import ServeError
from engine.serve.head_timeout import MAX_HEAD_BYTES, h11_with_head_deadline

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S = 10.0  # a request line and its headers arrive within this, or the connection is closed
KEEP_ALIVE_S = 5  # an idle kept-alive connection is closed after this (uvicorn's default, set explicitly)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ServeError(f"cannot listen on {host!r}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another port") from None
    sock.set_inheritable(True)
    return sock


class HttpServer:
    def __init__(
        self,
        app,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        access_log: bool = False,
        sock: socket.socket | None = None,
        head_timeout_s: float = HEAD_TIMEOUT_S,
    ) -> None:
        """sock: a socket already bound with bind_socket(host, port), e.g. to fail on a taken port before a model
        loads. head_timeout_s: a connection's request head must arrive within this (the body's deadline is the
        app's, ServeLimits.body_timeout_s)."""
        self.host = host
        self.socket = sock or bind_socket(host, port)
        self.port: int = self.socket.getsockname()[1]
        # log_config=None: uvicorn logs through the studio's logging setup instead of installing its own
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=access_log,
            lifespan="on",
            timeout_graceful_shutdown=3,
            http=h11_with_head_deadline(head_timeout_s),
            timeout_keep_alive=KEEP_ALIVE_S,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def started(self) -> bool:
        return self._server.started

    def run(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve in this thread until Ctrl+C (uvicorn handles the signals in the main thread)."""
        if on_ready is not None:
            threading.Thread(target=self._announce, args=(on_ready,), daemon=True).start()
        try:
            self._server.run(sockets=[self.socket])
        finally:
            self.socket.close()

    def _announce(self, on_ready: Callable[[str], None]) -> None:
        while not self._server.started and not self._server.should_exit:
            time.sleep(0.02)
        if self._server.started:
            on_ready(self.url)

    def start(self, timeout: float = 15.0) -> HttpServer:
        """Serve from a background thread; returns once the server accepts requests."""
        self._thread = threading.Thread(target=self.run, name=f"http-{self.port}", daemon=True)
        self._thread.start()
        ready = threading.Event()
        waiter = threading.Thread(target=self._announce, args=(lambda _url: ready.set(),), daemon=True)
        waiter.start()
        if not ready.wait(timeout):
            self.stop()
            raise ServeError(f"the server on port {self.port} did not start within {timeout:.0f} s")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Finish open responses (up to a few seconds), then stop; streams still open are cancelled."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
