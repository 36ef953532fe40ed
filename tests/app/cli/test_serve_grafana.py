"""vLLM's own Grafana dashboard works on the studio's /metrics: every series its panels query is exported, under
vLLM's names, labels and buckets, and moves when requests end.

The queries are vLLM's examples/online_serving/prometheus_grafana/grafana.json at commit
004f771f3a6b49597546b05c7d83686d1e121fa0 (tests/engine/serve/data/vllm-grafana-queries.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import openai
import pytest

from tests.serving import ServedStudio

QUERIES = json.loads((Path(__file__).parents[2] / "engine/serve/data/vllm-grafana-queries.json").read_text())
SERIES = re.compile(r"vllm:[a-z0-9_]+")
# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), written out here independently of the server's code
REQUEST_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
PER_TOKEN = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]


@pytest.fixture(scope="module")
def client(tiny_server: ServedStudio, server_api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.base_url, api_key=server_api_key, max_retries=0, timeout=60)


def dashboard_series() -> set[str]:
    return {name for query in QUERIES["queries"] for name in SERIES.findall(query["expr"])}


def bucket_bounds(samples: dict[str, float], histogram: str) -> list[float]:
    pattern = re.compile(rf'^{re.escape(histogram)}_bucket{{le="([^"]+)",model_name="tiny"}}$')
    bounds = [float(m.group(1)) for key in samples if (m := pattern.match(key)) and m.group(1) != "+Inf"]
    return sorted(bounds)


def test_every_series_the_dashboard_queries_is_exported_and_moves(
    client: openai.OpenAI, tiny_server: ServedStudio
) -> None:
    assert len(QUERIES["queries"]) >= 18 and len(dashboard_series()) == 21
    before = tiny_server.metrics()
    for _ in range(2):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                       extra_body={"ignore_eos": True})  # fmt: skip
    after = tiny_server.metrics()
    for name in sorted(dashboard_series()):
        labelled = [key for key in after if key.startswith(f"{name}{{") and 'model_name="tiny"' in key]
        assert labelled, f"{name} is not exported with the model_name label"
    for histogram in ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
                      "request_decode_time_seconds", "request_prompt_tokens", "request_generation_tokens",
                      "request_max_num_generation_tokens", "time_per_output_token_seconds"):  # fmt: skip
        count = f"vllm:{histogram}_count"
        assert after[count] >= before.get(count, 0) + 2, histogram
    assert after["vllm:request_generation_tokens_sum"] - before.get("vllm:request_generation_tokens_sum", 0) == 12
    assert after["vllm:gpu_cache_usage_perc"] == after["vllm:kv_cache_usage_perc"]
    assert any("finished_reason=" in key for key in after if key.startswith("vllm:request_success_total{"))


def test_histograms_use_vllms_buckets(client: openai.OpenAI, tiny_server: ServedStudio) -> None:
    samples = tiny_server.metrics()
    for phase in ("e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time",
                  "request_inference_time"):  # fmt: skip
        assert bucket_bounds(samples, f"vllm:{phase}_seconds") == REQUEST_LATENCY, phase
    assert bucket_bounds(samples, "vllm:time_per_output_token_seconds") == PER_TOKEN
    # token counts: vLLM's 1-2-5 series up to the model's context (max_model_len)
    context = client.models.list().data[0].model_extra["max_model_len"]
    series = [m * 10**e for e in range(6) for m in (1, 2, 5) if m * 10**e <= context]
    assert bucket_bounds(samples, "vllm:request_prompt_tokens") == series and series[-1] * 2.5 > context
