"""A tiny HTTP server for tests that stand in for a remote endpoint which fails, stalls or speaks an old dialect."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def stub_server(handle: Callable[[BaseHTTPRequestHandler], None]):
    """A tiny HTTP server answering every request with `handle`; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            handle(self)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            self.body = json.loads(self.rfile.read(length) or b"{}")
            handle(self)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def answer(request: BaseHTTPRequestHandler, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    request.send_response(status)
    request.send_header("Content-Type", "application/json")
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)
