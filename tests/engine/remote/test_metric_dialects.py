"""Remote endpoints that are not vLLM: llama.cpp's and TGI's metric names, and what each offers; llama.cpp's real
server where xllamacpp is installed, else its recorded metrics page."""

from __future__ import annotations

import importlib.util
import json
import threading
import urllib.request
from pathlib import Path

import pytest

from engine.remote.context_length import from_info, from_model_list, from_props
from engine.remote.metrics import parse_metrics
from tests.engine.remote.test_metrics import VLLM_TEXT

DATA = Path(__file__).parent / "data"
LLAMA_CPP_PAGE = (DATA / "llamacpp-metrics.txt").read_text()
TGI_PAGE = (DATA / "tgi-metrics.txt").read_text()


def test_llama_cpp_names_from_its_recorded_page() -> None:
    snapshot = parse_metrics(LLAMA_CPP_PAGE)
    assert snapshot.available and snapshot.server == "llama.cpp"
    assert snapshot.running == 4 and snapshot.waiting == 2  # requests_processing, requests_deferred
    assert snapshot.prompt_tokens_total == 41 and snapshot.generation_tokens_total == 16
    assert snapshot.cached_prompt_tokens_total == 27 and snapshot.busy_slots_per_decode == 1
    assert snapshot.kv_cache_usage is None and snapshot.ttft_mean_total_s is None  # this version reports neither
    assert snapshot.speculative_accepted_total is None  # counted, but it drafted nothing: speculation is off
    assert "running requests" in snapshot.offers and "prompt tokens from its cache" in snapshot.offers
    assert snapshot.lacks == ("KV-cache usage", "time to first token")
    assert snapshot.message.startswith("llama.cpp metrics: running requests, waiting requests")


def test_llama_cpp_versions_with_a_kv_gauge_and_speculation() -> None:
    page = LLAMA_CPP_PAGE.replace(
        "llamacpp:spec_decode_num_draft_tokens_total 0", "llamacpp:spec_decode_num_draft_tokens_total 40"
    )
    page = page.replace(
        "llamacpp:spec_decode_num_accepted_tokens_total 0", "llamacpp:spec_decode_num_accepted_tokens_total 31"
    )
    page += "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.25\n"
    snapshot = parse_metrics(page)
    assert snapshot.kv_cache_usage == 0.25 and "KV-cache usage" in snapshot.offers
    assert snapshot.speculative_accepted_total == 31 and snapshot.speculative_drafted_total == 40
    assert "speculative decoding" in snapshot.offers and snapshot.lacks == ("time to first token",)


def test_tgi_names() -> None:
    snapshot = parse_metrics(TGI_PAGE)
    assert snapshot.available and snapshot.server == "TGI"
    assert snapshot.running == 3 and snapshot.waiting == 2  # the current batch, the queue
    assert snapshot.generation_tokens_total == 1820 and snapshot.prompt_tokens_total == 700
    assert snapshot.time_per_token_s == pytest.approx(0.03)
    assert snapshot.lacks == ("KV-cache usage", "time to first token")
    assert "time per output token" in snapshot.offers


def test_the_servers_output_rate_comes_from_two_scrapes() -> None:
    first = parse_metrics(LLAMA_CPP_PAGE)
    later = LLAMA_CPP_PAGE.replace("llamacpp:tokens_predicted_total 16", "llamacpp:tokens_predicted_total 116")
    second = parse_metrics(later, previous=first)
    elapsed = second.time - first.time
    assert second.generation_tokens_per_s == pytest.approx(100 / elapsed)
    assert parse_metrics(LLAMA_CPP_PAGE).generation_tokens_per_s is None  # one scrape: no rate yet


def test_vllm_still_reads_as_before() -> None:
    snapshot = parse_metrics(VLLM_TEXT, model="llama")
    assert snapshot.server == "vLLM" and snapshot.lacks == ()
    assert snapshot.message.startswith("vLLM metrics: KV-cache usage, running requests, waiting requests")
    drafting = VLLM_TEXT + (
        'vllm:spec_decode_num_draft_tokens_total{model_name="llama"} 96.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{model_name="llama"} 46.0\n'
    )  # vLLM's (and the studio's) speculation counters, as the benchmark reads them from `serve`
    snapshot = parse_metrics(drafting, model="llama")
    assert (snapshot.speculative_drafted_total, snapshot.speculative_accepted_total) == (96, 46)
    assert "speculative decoding" in snapshot.offers


def test_context_lengths_where_servers_say_them() -> None:
    vllm = {"data": [{"id": "llama", "max_model_len": 32768}, {"id": "other", "max_model_len": 4096}]}
    assert from_model_list(vllm, "llama") == 32768 and from_model_list(vllm, "other") == 4096
    llama_cpp = {"data": [{"id": "/models/x.gguf", "meta": {"n_ctx": 2048, "n_ctx_train": 8192}}]}
    assert from_model_list(llama_cpp, "x") == 2048  # one model served under its path: that one
    assert from_model_list({"data": [{"id": "m"}]}, "m") is None
    assert from_props({"default_generation_settings": {"n_ctx": 1024}}) == 1024
    assert from_info({"max_total_tokens": 4096}) == 4096 and from_info([]) is None


@pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None, reason="llama.cpp's server (xllamacpp) is not installed"
)
def test_llama_cpp_s_real_server(qtbot) -> None:
    from engine.bench.servers import llama_cpp_server
    from engine.load.model_source import embedded_gguf_path
    from engine.remote.client import RemoteClient
    from widgets.dashboard.remote import RemotePanel

    with llama_cpp_server(str(embedded_gguf_path()), threads=2, slots=2, ctx=1024) as server:

        def ask() -> None:
            # every reply runs to max_tokens: a sampled "Count to ten." may end after a dozen tokens
            body = {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 48, "ignore_eos": True}
            request = urllib.request.Request(
                f"{server.url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            urllib.request.urlopen(request, timeout=120).read()

        askers = [threading.Thread(target=ask) for _ in range(3)]  # one more than it has slots
        for thread in askers:
            thread.start()
        with RemoteClient(server.url, name="llama-server") as client:
            qtbot.waitUntil(lambda: (client.scrape_metrics().running or 0) >= 1, timeout=60_000)
            busy = client.scrape_metrics()
            for thread in askers:
                thread.join(timeout=120)
            done = client.scrape_metrics()
            client.request_context_length()
            qtbot.waitUntil(lambda: client.context_length is not None, timeout=10_000)
        assert busy.server == "llama.cpp" and busy.running >= 1
        assert done.running == 0 and done.generation_tokens_total >= 3 * 48 * 0.5
        assert done.generation_tokens_per_s is not None and done.generation_tokens_per_s > 0
        assert client.context_length in (512, 1024)  # the context of a slot, or of the server's one shared buffer
    panel = RemotePanel()
    qtbot.addWidget(panel)
    panel.set_endpoint("model @ llama-server")
    panel.add(done)
    assert "llama.cpp metrics" in panel.status.text() and "not reported: KV-cache usage" in panel.status.text()
    assert not panel.kv_plot.isVisible() and panel.bottom == "rate"
