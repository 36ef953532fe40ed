"""`inference-studio serve` as a real subprocess, driven with the official openai client: models, chat and
completions with and without streaming, concurrency, disconnects, bad requests, the API key, /metrics."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.serving import ServedStudio, cache_the_chat_prompt

MODEL = "tiny"
HELLO = [{"role": "user", "content": "hello world"}]
LONG_RUN = {"ignore_eos": True}  # vLLM's extra field, honoured by the studio: random weights stop at random


@pytest.fixture(scope="module")
def client(tiny_server: ServedStudio, server_api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.base_url, api_key=server_api_key, max_retries=0, timeout=120)


def post(server: ServedStudio, path: str, body: object, key: str | None, raw: bytes | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = raw if raw is not None else json.dumps(body).encode()
    headers["Content-Type"] = "application/json"
    return httpx.post(f"{server.base_url}{path}", content=content, headers=headers, timeout=60)


def test_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_without_streaming(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, extra_body=LONG_RUN)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == MODEL
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 6 and reply.usage.prompt_tokens > 3
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 6
    # the same request again: every full page of its prompt (pages of 8) but the one holding its last token is cached
    full_pages = (reply.usage.prompt_tokens - 1) // 8 * 8
    assert full_pages >= 8 and 0 <= reply.usage.prompt_tokens_details.cached_tokens <= full_pages
    again = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, extra_body=LONG_RUN)
    assert again.usage.prompt_tokens_details.cached_tokens == full_pages


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1, extra_body=LONG_RUN)  # its prompt cached
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_completion_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=LONG_RUN,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 5
    # the same prompt again: its full pages come from the prefix cache
    full_pages = (usage.prompt_tokens - 1) // 8 * 8
    assert usage.prompt_tokens_details.cached_tokens == full_pages
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=5, temperature=0, extra_body=LONG_RUN
    )
    assert whole.choices[0].message.content == streamed
    assert whole.usage.prompt_tokens_details.cached_tokens == full_pages


def test_completions_with_and_without_streaming(client: openai.OpenAI) -> None:
    whole = client.completions.create(
        model=MODEL, prompt="the quick brown fox", max_tokens=4, temperature=0, extra_body=LONG_RUN
    )
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 4
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="the quick brown fox", max_tokens=4, temperature=0, stream=True, extra_body=LONG_RUN
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    by_ids = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=2, extra_body=LONG_RUN)
    assert by_ids.usage.prompt_tokens == 3 and by_ids.usage.completion_tokens == 2


def test_stop_strings_and_seed(client: openai.OpenAI) -> None:
    kwargs = {
        "model": MODEL,
        "messages": HELLO,
        "max_tokens": 12,
        "temperature": 1.0,
        "seed": 7,
        "extra_body": LONG_RUN,
    }
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    assert client.chat.completions.create(**kwargs).choices[0].message.content == first  # seeded: reproducible
    stop = first[3:5] if len(first) >= 5 else None
    if stop:
        cut = client.chat.completions.create(**kwargs, stop=[stop]).choices[0]
        assert cut.finish_reason == "stop" and stop not in cut.message.content


def test_eight_concurrent_streams_all_complete_and_preemption_moves(
    client: openai.OpenAI, tiny_server: ServedStudio
) -> None:
    before = tiny_server.metrics()

    def stream(index: int) -> tuple[str, str | None, float, float]:
        text, reason, first, last = "", None, 0.0, 0.0
        for chunk in client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"story number {index}"}],
            max_tokens=150,
            stream=True,
            extra_body=LONG_RUN,
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.monotonic()
                last = time.monotonic()
                text += chunk.choices[0].delta.content
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = chunk.choices[0].finish_reason
        return text, reason, first, last

    peaks = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}
    done = threading.Event()

    def watch() -> None:  # the gauges while the streams run: batched together, and some preempted back to waiting
        while not done.is_set():
            current = tiny_server.metrics()
            for name in peaks:
                peaks[name] = max(peaks[name], current[name])
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(stream, range(8)))
    done.set()
    watcher.join()
    assert peaks["vllm:num_requests_running"] > 1 and peaks["vllm:num_requests_waiting"] >= 1
    assert [reason for _, reason, _, _ in results] == ["length"] * 8
    assert max(first for _, _, first, _ in results) < min(last for _, _, _, last in results)  # they overlapped
    after = tiny_server.metrics()
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] >= 8 * 150
    # 8 x (prompt + 150) tokens do not fit in 128 pages of 8: the engine had to preempt
    assert after["vllm:num_preemptions_total"] > before["vllm:num_preemptions_total"]


def test_a_disconnect_mid_stream_cancels_the_request_and_frees_its_pages(
    client: openai.OpenAI, tiny_server: ServedStudio
) -> None:
    aborted = 'vllm:request_success_total{finished_reason="abort",model_name="tiny"}'
    before = tiny_server.metrics().get(aborted, 0.0)
    stream = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=900, stream=True, extra_body=LONG_RUN
    )
    received = 0
    for chunk in stream:
        received += 1 if chunk.choices and chunk.choices[0].delta.content else 0
        if received == 3:
            break
    assert tiny_server.metrics()["vllm:kv_cache_usage_perc"] > 0  # still running: it holds pages
    stream.close()  # the client goes away mid-reply
    tiny_server.wait_for_metric(aborted, lambda v: v == before + 1)
    tiny_server.wait_for_metric("vllm:num_requests_running", lambda v: v == 0)
    tiny_server.wait_for_metric("vllm:kv_cache_usage_perc", lambda v: v == 0)


def test_a_client_leaving_a_whole_reply_cancels_it(tiny_server: ServedStudio, server_api_key: str) -> None:
    aborted = 'vllm:request_success_total{finished_reason="abort",model_name="tiny"}'
    before = tiny_server.metrics().get(aborted, 0.0)
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 900, "ignore_eos": True}  # the context is 1,024
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{tiny_server.base_url}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {server_api_key}"},
            # gone long before 900 tokens can be made (about 0.6 s on 2 cores with the compiled step) and noticed
            timeout=httpx.Timeout(0.1, connect=10),
        )
    tiny_server.wait_for_metric(aborted, lambda v: v == before + 1)
    tiny_server.wait_for_metric("vllm:kv_cache_usage_perc", lambda v: v == 0)


CHAT = "/chat/completions"


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "words"),
    [
        (CHAT, {"model": "gpt-4", "messages": HELLO}, 404, "model", "does not exist"),
        (CHAT, {"model": MODEL}, 400, "messages", "'messages' is required"),
        (CHAT, {"model": MODEL, "messages": []}, 400, "messages", "non-empty list"),
        (CHAT, {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages", "unknown role"),
        (CHAT, {"messages": HELLO}, 400, "model", "provide a model"),
        (CHAT, {"model": MODEL, "messages": HELLO, "temperature": -1}, 400, "temperature", "must be in"),
        (CHAT, {"model": MODEL, "messages": HELLO, "temperature": "hot"}, 400, "temperature", "must be a number"),
        (CHAT, {"model": MODEL, "messages": HELLO, "top_p": 0}, 400, "top_p", "must be in (0, 1]"),
        (CHAT, {"model": MODEL, "messages": HELLO, "max_tokens": 0}, 400, "max_tokens", "at least 1"),
        (CHAT, {"model": MODEL, "messages": HELLO, "max_tokens": 2.5}, 400, "max_tokens", "integer"),
        (CHAT, {"model": MODEL, "messages": HELLO, "n": 3}, 400, "n", "'n' must be 1"),
        (CHAT, {"model": MODEL, "messages": HELLO, "stop": 7}, 400, "stop", "string or a list"),
        (CHAT, {"model": MODEL, "messages": HELLO, "stream": "yes"}, 400, "stream", "true or false"),
        (
            CHAT,
            {"model": MODEL, "messages": HELLO, "stream_options": {"include_usage": True}},
            400,
            "stream_options",
            "only allowed when",
        ),
        (CHAT, {"model": MODEL, "messages": HELLO, "logprobs": 3}, 400, "logprobs", "true or false"),
        (CHAT, {"model": MODEL, "messages": HELLO, "tools": [{"type": "function"}]}, 400, "tools", "tool 1 must be"),
        (CHAT, {"model": MODEL, "messages": HELLO, "functions": [{"name": "f"}]}, 400, "functions", "use 'tools'"),
        (
            CHAT,
            {
                "model": MODEL,
                "messages": HELLO,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                },
            },
            400,
            "response_format",
            "invalid json_schema",
        ),
        (CHAT, {"model": MODEL, "messages": HELLO, "logit_bias": {"99999": 5}}, 400, "logit_bias", "token ids must be"),
        (CHAT, {"model": MODEL, "messages": HELLO, "seed": "x"}, 400, "seed", "integer"),
        (CHAT, [1, 2, 3], 400, None, "JSON object"),
        ("/completions", {"model": MODEL}, 400, "prompt", "'prompt' is required"),
        ("/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt", "one prompt per request"),
        ("/completions", {"model": MODEL, "prompt": "hi", "echo": True}, 400, "echo", "not supported"),
        ("/completions", {"model": MODEL, "prompt": [99999]}, 400, "prompt", "token ids must be in"),
    ],
)
def test_bad_requests_get_openai_errors(
    tiny_server: ServedStudio, server_api_key: str, path: str, body: object, status: int, param, words: str
) -> None:
    response = post(tiny_server, path, body, server_api_key)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"] and error["param"] == param


def test_malformed_json_and_prompts_over_the_context(tiny_server: ServedStudio, server_api_key: str) -> None:
    response = post(tiny_server, CHAT, None, server_api_key, raw=b'{"model": "tiny", "messages": [')
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    too_long = [{"role": "user", "content": "hello world " * 1200}]  # over the model's 2048-token context
    response = post(tiny_server, CHAT, {"model": MODEL, "messages": too_long}, server_api_key)
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded"
    assert "context is 2048" in error["message"]
    over_pool = [{"role": "user", "content": "hello world " * 600}]  # fits the context, not the 1024-slot KV pool
    response = post(tiny_server, CHAT, {"model": MODEL, "messages": over_pool}, server_api_key)
    assert response.status_code == 400 and "KV cache holds only 1024" in response.json()["error"]["message"]


def test_errors_through_the_openai_client_and_the_server_keeps_serving(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=HELLO)
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=HELLO, n=2)
    with pytest.raises(openai.NotFoundError):
        client.get("/no/such/route", cast_to=object)
    ok = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, extra_body=LONG_RUN)
    assert ok.usage.completion_tokens == 2


def test_the_api_key_is_required(tiny_server: ServedStudio, server_api_key: str) -> None:
    for key in (None, "sk-wrong", server_api_key + "x"):
        response = post(tiny_server, CHAT, {"model": MODEL, "messages": HELLO}, key)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        assert httpx.get(f"{tiny_server.base_url}/models", headers=headers).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=tiny_server.base_url, api_key="sk-wrong", max_retries=0).models.list()
    # health and metrics stay open to probes and scrapers, as in vLLM
    assert httpx.get(f"{tiny_server.url}/health").status_code == 200
    assert httpx.get(f"{tiny_server.url}/metrics").status_code == 200


VLLM_NAMES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
]


def test_metrics_use_vllm_names_and_move(client: openai.OpenAI, tiny_server: ServedStudio) -> None:
    before = tiny_server.metrics()
    for name in VLLM_NAMES:
        assert f'{name}{{model_name="tiny"}}' in before, name
    system = {"role": "system", "content": "You are a helpful assistant who answers briefly. " * 3}
    for _ in range(2):  # the second request reuses the first's system-prompt pages
        client.chat.completions.create(
            model=MODEL, messages=[system, *HELLO], max_tokens=8, stream=True, extra_body=LONG_RUN
        ).close()
        client.chat.completions.create(model=MODEL, messages=[system, *HELLO], max_tokens=8, extra_body=LONG_RUN)
    after = tiny_server.metrics()
    for name in ["vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_sum"]:  # fmt: skip
        assert after[name] > before[name], name
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] >= 16
    assert (
        after['vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="tiny"}']
        == after["vllm:time_to_first_token_seconds_count"]
    )


def test_running_and_kv_usage_gauges_follow_a_live_request(client: openai.OpenAI, tiny_server: ServedStudio) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=900, stream=True, extra_body=LONG_RUN
    )
    next(iter(stream))
    next(iter(stream))
    live = tiny_server.metrics()
    assert live["vllm:num_requests_running"] == 1 and 0 < live["vllm:kv_cache_usage_perc"] <= 1
    stream.close()
    tiny_server.wait_for_metric("vllm:num_requests_running", lambda v: v == 0)


def test_no_key_in_any_log_line(tiny_server: ServedStudio, server_api_key: str) -> None:
    logs = tiny_server.logs()
    assert "POST /v1/chat/completions" in logs  # the access log is on (-v): there is something to check
    assert server_api_key not in logs


# ---- the embedded model: real text -----------------------------------------------------------------


def test_real_answers_from_the_embedded_model(embedded_server: ServedStudio) -> None:
    client = openai.OpenAI(base_url=embedded_server.base_url, api_key="unused", max_retries=0, timeout=120)
    system = {"role": "system", "content": "You are a concise geography assistant. Answer in one short sentence."}
    messages = [system, {"role": "user", "content": "What is the capital of France?"}]
    cache_the_chat_prompt(client, model="smollm2", messages=messages, temperature=0)
    whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24, temperature=0)
    assert "Paris" in whole.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    # the second request found the system prompt's pages in the prefix cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 16
    text = client.completions.create(model="smollm2", prompt="The capital of Germany is", max_tokens=4, temperature=0)
    assert "Berlin" in text.choices[0].text
