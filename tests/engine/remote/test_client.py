"""RemoteClient against the studio's own server (the studio as its own remote) and against stub servers that
fail, stall or serve no metrics: same events as the local engine, clear messages instead of hangs."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from engine.errors import InvalidRequestError, RemoteError
from engine.remote.client import RemoteClient
from engine.remote.endpoints import normalize_base_url
from engine.remote.metrics import CLIENT_SIDE_ONLY
from engine.types import SamplingParams
from tests.serving import ServedStudio
from tests.stub_server import answer, stub_server

HELLO = [{"role": "user", "content": "hello world"}]


@pytest.fixture
def remote(tiny_server: ServedStudio, server_api_key: str):
    with RemoteClient(tiny_server.base_url, api_key=server_api_key, model="tiny", name="studio") as client:
        yield client


def test_base_urls_are_normalized() -> None:
    assert normalize_base_url("gpu-box:8000") == "http://gpu-box:8000/v1"
    assert normalize_base_url("http://gpu-box:8000/") == "http://gpu-box:8000/v1"
    assert normalize_base_url("https://example.com/openai/v1/") == "https://example.com/openai/v1"
    with pytest.raises(RemoteError, match="not an http"):
        normalize_base_url("ftp://files")


def test_models_health_and_a_streamed_chat(remote: RemoteClient) -> None:
    assert remote.list_models() == ["tiny"]
    health = remote.health()
    assert health.ok and health.latency_s is not None
    handle = remote.submit(messages=HELLO, params=SamplingParams(max_tokens=12, ignore_eos=True), tag="tab 1")
    events = list(handle.events(timeout=60))
    assert events[-1].finished and not any(e.finished for e in events[:-1])
    assert all(e.tag == "tab 1" and e.request_id == handle.request_id for e in events)
    result = handle.result(timeout=1)
    assert result.finish_reason == "length" and result.error is None
    assert result.text == "".join(e.text for e in events) and result.text
    stats = result.stats
    assert stats.output_tokens == 12 and stats.prompt_tokens > 3 and result.prompt_tokens == stats.prompt_tokens
    assert stats.ttft_s > 0 and stats.e2e_s >= stats.ttft_s
    seen: list = []  # the same request with a sink: the sink gets what the handle got, and the handle keeps none
    sunk = remote.submit(messages=HELLO, params=SamplingParams(max_tokens=12, ignore_eos=True), sink=seen.extend)
    assert sunk.wait(timeout=60).finish_reason == "length" and seen[-1].finished
    assert [e.text for e in seen] == [e.text for e in events] and sunk.pending == 0 and not sunk.text_parts
    snapshot = remote.metrics.snapshot()  # client-side timings for the dashboard
    assert snapshot.tokens and snapshot.tokens[0].index == 0 and snapshot.finished[-1]["output_tokens"] == 12


def test_raw_prompts_and_token_ids_use_completions(remote: RemoteClient) -> None:
    raw = remote.submit(prompt="the quick brown fox", raw=True, params=SamplingParams(max_tokens=3, ignore_eos=True))
    ids = remote.submit([5, 6, 7], params=SamplingParams(max_tokens=2, ignore_eos=True))
    assert raw.result(timeout=60).stats.output_tokens == 3
    result = ids.result(timeout=60)
    assert result.stats.output_tokens == 2 and result.stats.prompt_tokens == 3


def test_bad_input_raises_in_the_caller(remote: RemoteClient) -> None:
    with pytest.raises(InvalidRequestError):
        remote.submit(prompt="  ")
    with pytest.raises(InvalidRequestError):
        remote.submit(messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(InvalidRequestError):
        remote.submit(messages=HELLO, params=SamplingParams(temperature=-1))


def test_cancel_closes_the_stream_and_the_remote_frees_the_pages(remote: RemoteClient, tiny_server) -> None:
    handle = remote.submit(messages=HELLO, params=SamplingParams(max_tokens=900, ignore_eos=True))
    events = handle.events(timeout=60)
    next(events)
    next(events)
    handle.cancel()
    result = handle.result(timeout=10)
    assert result.finish_reason == "abort" and result.error is None and result.stats.output_tokens >= 2
    tiny_server.wait_for_metric("vllm:num_requests_running", lambda v: v == 0)
    tiny_server.wait_for_metric("vllm:kv_cache_usage_perc", lambda v: v == 0)


def test_the_remote_reports_vllm_metrics(remote: RemoteClient) -> None:
    remote.submit(messages=HELLO, params=SamplingParams(max_tokens=4, ignore_eos=True)).result(timeout=60)
    first = remote.scrape_metrics()
    assert first.available and first.message.startswith("vLLM metrics: KV-cache usage, running requests")
    assert first.kv_cache_usage == 0 and first.running == 0 and first.waiting == 0
    assert first.ttft_mean_total_s > 0 and first.generation_tokens_total >= 4
    remote.submit(messages=HELLO, params=SamplingParams(max_tokens=4, ignore_eos=True)).result(timeout=60)
    second = remote.scrape_metrics()
    assert second.ttft_count == first.ttft_count + 1 and second.ttft_mean_s > 0
    # in the background, for a dashboard timer that must not wait on the network
    remote.latest_metrics = None
    remote.poll_metrics(0.05)
    deadline = time.monotonic() + 30
    while remote.latest_metrics is None and time.monotonic() < deadline:
        time.sleep(0.02)
    remote.poll_metrics(None)
    assert remote.latest_metrics is not None and remote.latest_metrics.available


def test_a_wrong_key_is_a_clear_error(tiny_server: ServedStudio, server_api_key: str, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with RemoteClient(tiny_server.base_url, api_key="sk-wrong-key", model="tiny", name="studio") as client:
        result = client.submit(messages=HELLO).result(timeout=30)
        assert result.finish_reason == "error"
        assert "studio answered 401" in result.error and "API key" in result.error
        with pytest.raises(RemoteError, match="401"):
            client.list_models()
        assert client.health().ok  # /health is open without a key, as in vLLM
    with RemoteClient(tiny_server.base_url, api_key=server_api_key, model="tiny") as client:
        client.submit(messages=HELLO, params=SamplingParams(max_tokens=2)).result(timeout=30)
        assert server_api_key not in repr(client)
    assert "sk-wrong-key" not in caplog.text and server_api_key not in caplog.text


def test_the_model_is_picked_from_the_list_when_none_is_set(tiny_server: ServedStudio, server_api_key: str) -> None:
    with RemoteClient(tiny_server.base_url, api_key=server_api_key) as client:
        result = client.submit(messages=HELLO, params=SamplingParams(max_tokens=2, ignore_eos=True)).result(30)
        assert result.finish_reason == "length"


def test_real_text_from_the_embedded_model(embedded_server: ServedStudio) -> None:
    with RemoteClient(embedded_server.base_url, model="smollm2") as client:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        result = client.submit(messages=messages, params=SamplingParams(max_tokens=24)).result(timeout=120)
        assert "Paris" in result.text and result.finish_reason in ("stop", "length")
        assert result.stats.decode_tokens_per_s and result.stats.decode_tokens_per_s > 0


# ---- stub servers ---------------------------------------------------------------------------------


def test_a_server_error_is_reported_in_the_event() -> None:
    def fail(request) -> None:
        answer(request, 500, {"error": {"message": "the GPU caught fire", "type": "server_error"}})

    with stub_server(fail) as url, RemoteClient(url, model="m", name="cluster") as client:
        result = client.submit(messages=HELLO).result(timeout=10)
        assert result.finish_reason == "error" and result.error == "cluster answered 500: the GPU caught fire"
        with pytest.raises(RemoteError, match="cluster answered 500"):
            client.list_models()
        assert not client.health().ok


def test_a_stalled_server_times_out_with_a_clear_message() -> None:
    release, stall_over = threading.Event(), threading.Event()

    def stall(request) -> None:
        request.send_response(200)
        request.send_header("Content-Type", "text/event-stream")
        request.end_headers()
        request.wfile.write(b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n')
        request.wfile.flush()
        release.wait(120)  # then nothing: a stuck server
        stall_over.set()

    with stub_server(stall) as url, RemoteClient(url, model="m", name="cluster", read_timeout_s=0.5) as client:
        handle = client.submit(messages=HELLO)
        result = handle.result(timeout=60)
        stalled_throughout = not stall_over.is_set()  # the client gave up on its own, the server still silent
        release.set()
    assert stalled_throughout
    assert result.finish_reason == "error" and result.text == "Hel"
    assert "no answer from" in result.error and "for 0.5 s" in result.error and "stalled" in result.error


def test_an_unreachable_server_fails_fast() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with RemoteClient(f"http://127.0.0.1:{port}", model="m", name="cluster", connect_timeout_s=2) as client:
        result = client.submit(messages=HELLO).result(timeout=10)
        assert result.finish_reason == "error" and "could not connect" in result.error
        health = client.health()
        assert not health.ok and "could not connect" in health.message
        snapshot = client.scrape_metrics()
        assert not snapshot.available and snapshot.message.startswith(CLIENT_SIDE_ONLY)


def test_a_stream_cut_short_is_an_error_not_a_hang() -> None:
    def cut(request) -> None:
        request.send_response(200)
        request.send_header("Content-Type", "text/event-stream")
        request.end_headers()
        request.wfile.write(b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n')

    with stub_server(cut) as url, RemoteClient(url, model="m", name="cluster", read_timeout_s=5) as client:
        result = client.submit(messages=HELLO).result(timeout=10)
    assert result.finish_reason == "error" and "before the reply was complete" in result.error


def test_stop_closes_the_remote_stream() -> None:
    closed = threading.Event()

    def endless(request) -> None:
        request.send_response(200)
        request.send_header("Content-Type", "text/event-stream")
        request.end_headers()
        try:
            for _ in range(2000):
                request.wfile.write(b'data: {"choices": [{"index": 0, "delta": {"content": "la "}}]}\n\n')
                request.wfile.flush()
                time.sleep(0.005)
        except (BrokenPipeError, ConnectionResetError):
            closed.set()

    with stub_server(endless) as url, RemoteClient(url, model="m", name="cluster") as client:
        handle = client.submit(messages=HELLO)
        events = handle.events(timeout=10)
        for _ in range(3):
            next(events)
        handle.cancel()
        result = handle.result(timeout=5)
        assert result.finish_reason == "abort" and result.stats.output_tokens >= 3
        assert closed.wait(10)  # the server saw the connection go


def test_a_server_without_stream_options_and_without_metrics() -> None:
    requests: list[dict] = []

    def old_server(request) -> None:
        if request.command == "GET":
            answer(request, 404, {"detail": "Not Found"})
            return
        requests.append(request.body)
        if "stream_options" in request.body:
            answer(request, 400, {"error": {"message": "Unrecognized request argument: stream_options"}})
            return
        request.send_response(200)
        request.send_header("Content-Type", "text/event-stream")
        request.end_headers()
        for piece in ("Hello", " there"):
            request.wfile.write(
                f'data: {{"choices": [{{"index": 0, "delta": {{"content": "{piece}"}}}}]}}\n\n'.encode()
            )
        request.wfile.write(b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n')
        request.wfile.write(b"data: [DONE]\n\n")

    with stub_server(old_server) as url, RemoteClient(url, model="m", name="ollama") as client:
        result = client.submit(messages=HELLO, params=SamplingParams(max_tokens=5, temperature=0.2)).result(10)
        assert result.text == "Hello there" and result.finish_reason == "stop"
        assert result.stats.output_tokens == 2  # counted from the chunks: no usage came back
        snapshot = client.scrape_metrics()
    assert not snapshot.available and snapshot.message == f"{CLIENT_SIDE_ONLY} (GET /metrics answered 404)"
    assert requests[-1]["model"] == "m" and requests[-1]["max_tokens"] == 5 and requests[-1]["temperature"] == 0.2
    assert "top_k" not in requests[-1]  # vLLM extras only when used: strict servers refuse unknown fields


def test_endpoint_keys_live_in_the_keyring(memory_keyring, tiny_server: ServedStudio, server_api_key: str) -> None:
    from engine.remote.endpoints import Endpoint

    endpoint = Endpoint("gpu cluster", tiny_server.url)  # the root URL: /v1 is added
    assert endpoint.base_url == tiny_server.base_url
    endpoint.store_api_key(server_api_key)
    assert memory_keyring.store == {("inference-studio", "endpoint:gpu cluster"): server_api_key}
    assert server_api_key not in repr(endpoint)
    with endpoint.client(model="tiny") as client:
        assert client.list_models() == ["tiny"]
    endpoint.store_api_key("")
    assert memory_keyring.store == {}
    with pytest.raises(RemoteError, match="needs a name"):
        Endpoint(" ", "http://x")


def test_a_closed_client_says_so() -> None:
    client = RemoteClient("http://127.0.0.1:9", model="m", name="box").start()
    client.shutdown()
    assert not client.alive
    with pytest.raises(RemoteError, match="connection to box was closed"):
        client.submit(messages=HELLO)
    client.shutdown()  # again: harmless


def test_openai_features_pass_through_to_a_remote_endpoint() -> None:
    """Structured output, logprobs, logit bias and tools go to the remote as OpenAI's fields (vLLM's extras for
    regex/choice/grammar); its logprobs and streamed tool-call deltas come back on the events."""
    import json as _json

    from engine.types import StructuredOutput

    seen: list[dict] = []
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"tz": '}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"CET"}'}}]}}]},
        {"choices": [{"index": 0, "delta": {"content": "ok"}, "logprobs": {"content": [
            {"token": "ok", "logprob": -0.1, "top_logprobs": [
                {"token": "ok", "logprob": -0.1}, {"token": "no", "logprob": -2.5}]}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]  # fmt: skip

    def server(request) -> None:
        seen.append(request.body)
        request.send_response(200)
        request.send_header("Content-Type", "text/event-stream")
        request.end_headers()
        for chunk in chunks:
            request.wfile.write(f"data: {_json.dumps(chunk)}\n\n".encode())
        request.wfile.write(b"data: [DONE]\n\n")

    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    schema = StructuredOutput("json_schema", '{"type": "object"}')
    params = SamplingParams(max_tokens=8, logprobs=2, logit_bias=((5, 1.5),), structured=schema)
    with stub_server(server) as url, RemoteClient(url, model="m", name="cluster") as client:
        handle = client.submit(
            messages=[{"role": "user", "content": "hi"}], params=params, tools=tools, tool_choice="auto"
        )
        events = list(handle.events(timeout=30))
    body = seen[0]
    assert body["logprobs"] is True and body["top_logprobs"] == 2 and body["logit_bias"] == {"5": 1.5}
    assert body["response_format"]["type"] == "json_schema" and body["tools"] == tools and body["tool_choice"] == "auto"
    logprobs = [lp for e in events for lp in (e.logprobs or [])]
    assert logprobs[0].text == "ok" and [a.text for a in logprobs[0].top] == ["ok", "no"]
    final = events[-1]
    assert final.finished and final.tool_calls == [
        {"type": "function", "id": "call_1", "function": {"name": "get_time", "arguments": '{"tz": "CET"}'}}
    ]
    regex = SamplingParams(structured=StructuredOutput("regex", "[0-9]+"))
    from engine.remote.stream import sampling_fields

    assert sampling_fields(regex)["structured_outputs"] == {"regex": "[0-9]+"}
