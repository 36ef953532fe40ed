"""Read deadlines, over raw sockets against a real uvicorn in process (deadlines of 1 s here; 10 s and 30 s by
default): an idle or trickling connection is closed when its request head is late, a body shorter than its
Content-Length gets a 408 and the end of the connection, and neither deadline touches a reply that streams for
longer than both."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from engine.serve.app import create_app
from engine.serve.http_server import HttpServer
from engine.serve.limits import ServeLimits

DEADLINE_S = 1.0
WAIT_S = 30  # generous: the machine is shared; before the deadlines these sockets stayed open for good


@pytest.fixture
def server(make_engine):
    from engine.core.engine_thread import EngineThread

    worker = EngineThread(make_engine()).start()
    app = create_app(worker, "tiny", limits=ServeLimits(body_timeout_s=1))
    http = HttpServer(app, "127.0.0.1", 0, head_timeout_s=DEADLINE_S).start()
    yield http, worker
    http.stop()
    worker.shutdown()


def connect(http: HttpServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", http.port), timeout=WAIT_S)
    return sock


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    started, data = time.monotonic(), b""
    while chunk := sock.recv(65536):  # socket.timeout (a failure) if the server never closes
        data += chunk
    return data, time.monotonic() - started


def test_a_connection_that_sends_nothing_is_closed(server) -> None:
    http, _ = server
    with connect(http) as sock:
        data, _ = read_until_closed(sock)
    assert data == b""


def test_a_request_head_that_never_ends_is_closed(server) -> None:
    http, _ = server
    with connect(http) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        time.sleep(DEADLINE_S / 2)
        sock.sendall(b"X-Slow: 1\r\n")  # a byte now and then does not extend the deadline
        data, _ = read_until_closed(sock)
    assert data == b""


def test_a_kept_alive_connection_whose_next_head_never_ends_is_closed(server) -> None:
    http, _ = server
    with connect(http) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while not first.endswith(b'{"status":"ok"}'):
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127")  # the next head, never finished
        data, _ = read_until_closed(sock)
    assert data == b""


def test_a_body_shorter_than_its_length_gets_408_and_the_connection_ends(server) -> None:
    http, _ = server
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]'
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) + 1000}\r\n\r\n"
    ).encode()
    with connect(http) as sock:
        sock.sendall(head + body)
        data, _ = read_until_closed(sock)
    status, _, rest = data.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408"), data[:200]
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "request_timeout" and "did not arrive" in error["message"]


def test_a_reply_streaming_longer_than_the_deadlines_is_not_cut(server) -> None:
    http, worker = server
    worker.call(lambda engine: setattr(engine, "fault_injector", lambda _s: time.sleep(0.25))).result(10)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "ignore_eos": True,
            "stream": True}  # fmt: skip
    started = time.monotonic()
    with httpx.stream("POST", f"{http.url}/v1/chat/completions", json=body, timeout=WAIT_S) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert time.monotonic() - started > 2 * DEADLINE_S  # it did outlast both deadlines
    assert lines[-1] == "data: [DONE]" and '"finish_reason": "length"' in lines[-2]
