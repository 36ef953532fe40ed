"""The API server under faults, in process over a real engine thread: a full waiting queue (429), an engine that is
stuck or dead (/health 503, streams that end instead of looping), a thread started again, allowed Host names."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.serve.app import create_app
from engine.serve.http_server import HttpServer
from engine.serve.limits import ServeLimits

HELLO = [{"role": "user", "content": "hi"}]
LIMIT_S = 60


class Fatal(BaseException):
    """Escapes every `except Exception`: the engine thread dies of it."""


@pytest.fixture
def serve(make_engine):
    """serve(limits=..., allowed_hosts=..., **thread options) -> (base URL, engine thread)."""
    from engine.core.engine_thread import EngineThread

    started: list[tuple[HttpServer, EngineThread]] = []

    def build(limits: ServeLimits | None = None, allowed_hosts=None, **thread_options):
        worker = EngineThread(make_engine(), **thread_options).start()
        app = create_app(worker, "tiny", limits=limits, allowed_hosts=allowed_hosts)
        server = HttpServer(app, "127.0.0.1", 0).start()
        started.append((server, worker))
        return server.url, worker

    yield build
    for server, worker in started:
        server.stop()
        worker.shutdown()


def chat(url: str, **fields) -> httpx.Response:
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 4, "ignore_eos": True, **fields}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=LIMIT_S)


def block_steps(worker) -> threading.Event:
    """Every step waits until the returned event is set (a stuck device, a slow prefill)."""
    release = threading.Event()
    worker.call(lambda engine: setattr(engine, "fault_injector", lambda _s: release.wait(LIMIT_S))).result(10)
    return release


def wait_for(predicate, limit_s: float = LIMIT_S) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_a_full_waiting_queue_answers_429_with_retry_after(serve) -> None:
    url, worker = serve(ServeLimits(max_waiting=2))
    release = block_steps(worker)
    with ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(chat, url) for _ in range(2)]
        wait_for(lambda: worker.num_waiting + len(worker.engine.scheduler.running) == 2)
        refused = chat(url)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "queue_full"
        release.set()
        worker.engine.fault_injector = None
        assert [f.result(LIMIT_S).status_code for f in waiting] == [200, 200]
    assert chat(url).status_code == 200  # room again


def test_a_stuck_engine_is_reported_by_health(serve) -> None:
    url, worker = serve(stuck_after_s=0.5)
    assert httpx.get(f"{url}/health", timeout=LIMIT_S).status_code == 200
    release = block_steps(worker)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(chat, url)
        wait_for(lambda: httpx.get(f"{url}/health", timeout=LIMIT_S).status_code == 503)
        health = httpx.get(f"{url}/health", timeout=LIMIT_S).json()
        assert health["status"] == "unhealthy" and "no progress" in health["reason"]
        answer = pending.result(LIMIT_S)  # the waiting client is released with an error, not left hanging
        assert answer.status_code == 500 and "no progress" in answer.json()["error"]["message"]
    worker.engine.fault_injector = None
    release.set()
    wait_for(lambda: httpx.get(f"{url}/health", timeout=LIMIT_S).status_code == 200)


def test_a_stream_ends_when_the_engine_thread_dies_and_health_says_so(serve) -> None:
    url, worker = serve(max_restarts=0)
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=LIMIT_S) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")

        def kill(_scheduled) -> None:
            raise Fatal("the engine thread is gone")

        worker.call(lambda engine: setattr(engine, "fault_injector", kill))
        rest = list(lines)  # must end: the bridge does not loop on a dead thread
    assert any("the engine thread is gone" in line for line in rest) and "data: [DONE]" in rest
    health = httpx.get(f"{url}/health", timeout=LIMIT_S)
    assert health.status_code == 503 and "stopped" in health.json()["reason"]
    refused = chat(url)
    assert refused.status_code == 503 and "not available" in refused.json()["error"]["message"]


def test_a_thread_started_again_serves_again(serve) -> None:
    url, worker = serve()

    def kill_once(_scheduled) -> None:
        worker.engine.fault_injector = None
        raise Fatal("died once")

    worker.call(lambda engine: setattr(engine, "fault_injector", kill_once)).result(10)
    failed = chat(url)
    assert failed.status_code == 500 and "died once" in failed.json()["error"]["message"]
    wait_for(lambda: worker.restarts == 1)
    assert httpx.get(f"{url}/health", timeout=LIMIT_S).status_code == 200
    assert chat(url).status_code == 200


def test_allowed_hosts_and_a_small_body_cap(serve) -> None:
    url, _worker = serve(ServeLimits(max_body_bytes=1000), allowed_hosts=("localhost", "studio.lan"))
    for host, status in (("studio.lan:8000", 200), ("STUDIO.LAN", 200), ("127.0.0.2", 200), ("other.lan", 403)):
        assert httpx.get(f"{url}/v1/models", headers={"Host": host}, timeout=LIMIT_S).status_code == status
    big = chat(url, messages=[{"role": "user", "content": "x" * 2000}])
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"

    def chunks():
        for _ in range(10):
            yield b"x" * 500

    streamed = httpx.post(f"{url}/v1/chat/completions", content=chunks(), timeout=LIMIT_S)  # chunked, no length
    assert streamed.status_code == 413


def test_the_advertised_and_enforced_context_is_what_the_kv_pool_holds(serve) -> None:
    """Defect 2 of the window issue: a 352-token KV budget advertised the model's 8,192 and cut a reply that asked
    for 900 tokens at 318 with `length`, instead of refusing it."""
    url, worker = serve()  # 64 pages of 4 tokens: 256 tokens, the tiny model's context is 2,048
    pool = worker.engine.pool_tokens
    assert pool < worker.engine.context_length
    models = httpx.get(f"{url}/v1/models", timeout=LIMIT_S).json()["data"]
    assert models[0]["max_model_len"] == pool
    response = chat(url, max_tokens=pool, min_tokens=pool - 20)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert f"maximum context length is {pool} tokens" in chat(url, max_tokens=pool).json()["error"]["message"]
    assert chat(url, max_tokens=8).status_code == 200
