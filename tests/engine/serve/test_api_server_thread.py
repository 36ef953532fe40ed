"""The API server in a background thread over an engine that is also used directly, as the studio window does."""

from __future__ import annotations

import httpx
import openai
import pytest

from engine.errors import ServeError
from engine.serve.app import create_app
from engine.serve.http_server import HttpServer
from engine.types import SamplingParams


@pytest.fixture
def worker(make_engine):
    from engine.core.engine_thread import EngineThread

    thread = EngineThread(make_engine(kv_pages=64, page_size=4)).start()
    yield thread
    thread.shutdown()


def test_serves_beside_direct_requests_then_stops(worker) -> None:
    server = HttpServer(create_app(worker, "tiny"), "127.0.0.1", 0).start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)
        chat = worker.submit([5, 6, 7], params=SamplingParams(max_tokens=40, ignore_eos=True), tag="Chat 1")
        stream = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text and chat.result(timeout=60).stats.output_tokens == 40
        with pytest.raises(ServeError, match="cannot listen"):
            HttpServer(create_app(worker, "tiny"), "127.0.0.1", server.port)  # the port is taken
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health", timeout=5)
    assert worker.alive  # the engine outlives the server: the chats keep it


def test_stopping_with_an_open_stream_cancels_it(worker) -> None:
    from engine.serve.local_server import LocalApiServer

    server = LocalApiServer(worker, "tiny", port=0).start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,  # until the context ends
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    next(iter(stream))
    server.stop()
    with pytest.raises(openai.APIError, match="the server is stopping"):
        for _ in stream:
            pass
    assert worker.call(lambda engine: engine.pool.num_used).result(timeout=30) == 0
