"""Requests that stall everyone, in process over a real engine thread: streams whose clients do not read are ended at
a bounded backlog (their running slots and pages freed, the clients told when they read again), and a request that
waits in the queue past --max-queue-wait gets 429 instead of waiting for good; a long prompt being prefilled is not
a request waiting."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.serve.app import create_app
from engine.serve.http_server import HttpServer, bind_socket
from engine.serve.limits import ServeLimits

LIMIT_S = 90  # generous: the machine is shared


@pytest.fixture
def serve(make_engine):
    from engine.core.engine_thread import EngineThread

    started: list[tuple[HttpServer, EngineThread]] = []

    def build(limits: ServeLimits, step_s: float = 0.0, **engine_config):
        engine = make_engine(**{"kv_pages": 600, "page_size": 16, **engine_config})
        worker = EngineThread(engine).start()
        if step_s:
            worker.call(lambda e: setattr(e, "fault_injector", lambda _s: time.sleep(step_s))).result(10)
        # small kernel send buffers (accepted sockets inherit them), as on a slow link: what a client leaves unread
        # reaches the server's own buffers after kilobytes, not megabytes
        sock = bind_socket("127.0.0.1", 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        server = HttpServer(create_app(worker, "tiny", limits=limits), "127.0.0.1", 0, sock=sock).start()
        started.append((server, worker))
        return server, worker

    yield build
    for server, worker in started:
        server.stop()
        worker.shutdown()


def body(**fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True, **fields}


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def open_unread_stream(server: HttpServer, max_tokens: int) -> socket.socket:
    """A streaming request from a client that then reads nothing (a small receive buffer, and chunks of about a kB
    with 5 alternatives per token, so the kernel's and the server's buffers fill soon)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(LIMIT_S)
    sock.connect(("127.0.0.1", server.port))
    payload = json.dumps(body(max_tokens=max_tokens, stream=True, logprobs=True, top_logprobs=5)).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()  # fmt: skip
    sock.sendall(head + payload)
    return sock


def test_streams_whose_clients_do_not_read_are_ended_and_free_their_slots(serve) -> None:
    """Two clients that never read hold both running slots (max_running 2) while the engine writes for them: past a
    backlog of 16 unread chunks each is cancelled, a new request is answered, and a client that reads at last gets
    what was buffered, then the reason, then [DONE]."""
    server, worker = serve(ServeLimits(stream_backlog=16), max_running=2)
    sockets = [open_unread_stream(server, max_tokens=1900) for _ in range(2)]
    try:
        wait_for(lambda: len(worker.engine.scheduler.running) == 2, "the two streams did not start")
        # before the bound they ran to max_tokens (1,900 tokens each) for clients that read nothing
        wait_for(lambda: not worker.engine.requests, "the unread streams kept their slots")
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body(max_tokens=4), timeout=LIMIT_S)
        assert answer.status_code == 200
        data = b""
        while chunk := sockets[0].recv(65536):
            data += chunk
        events = [line for line in data.decode(errors="replace").split("\n") if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["error"]["code"] == "stream_not_read"
    finally:
        for sock in sockets:
            sock.close()


def test_a_request_waiting_past_the_queue_limit_gets_429(serve) -> None:
    """One running slot, held by a slow reply; the next request waits in the queue. Before the limit it waited until
    the slot freed (the issue saw 420 s); now it gets 429 queue_timeout after 1 s, and a stream says so in the
    stream."""
    server, worker = serve(ServeLimits(max_queue_wait_s=1), step_s=0.05, max_running=1)
    url = f"{server.url}/v1/chat/completions"
    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(httpx.post, url, json=body(max_tokens=400), timeout=LIMIT_S)
        wait_for(lambda: len(worker.engine.scheduler.running) == 1, "the first request did not start")
        refused = httpx.post(url, json=body(max_tokens=4), timeout=LIMIT_S)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "queue_timeout" and refused.headers["Retry-After"] == "1"
        with httpx.stream("POST", url, json=body(max_tokens=4, stream=True), timeout=LIMIT_S) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert json.loads(lines[-2][6:])["error"]["code"] == "queue_timeout" and lines[-1] == "data: [DONE]"
        wait_for(lambda: not worker.engine.scheduler.waiting, "the refused requests stayed queued")
        worker.cancel(next(iter(worker.engine.requests)))  # done with the holder
        holder.result(LIMIT_S)


def test_a_long_prefill_is_not_a_queue_wait(serve) -> None:
    """A request that has started (its prompt prefilling in slow steps) is never refused for waiting."""
    server, worker = serve(ServeLimits(max_queue_wait_s=1), max_step_tokens=16)
    release = threading.Event()
    worker.call(lambda e: setattr(e, "fault_injector", lambda _s: release.wait(1.5))).result(10)
    long_prompt = [{"role": "user", "content": "hello world " * 60}]
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body(messages=long_prompt, max_tokens=2),
                          timeout=LIMIT_S)  # fmt: skip
    release.set()
    assert response.status_code == 200, response.text
