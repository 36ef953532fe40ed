"""What a remote endpoint's /metrics says, if it speaks vLLM's names: KV-cache usage, running/waiting, TTFT."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

CLIENT_SIDE_ONLY = "only client-side timings are available"

# older vLLM versions called the KV-cache gauge gpu_cache_usage_perc
_KV_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass(frozen=True)
class RemoteMetricsSnapshot:
    """One scrape. When `available` is False, `message` says why and every figure is None."""

    available: bool
    message: str
    time: float
    kv_cache_usage: float | None = None  # 0..1
    running: float | None = None
    waiting: float | None = None
    ttft_mean_s: float | None = None  # mean TTFT of requests since the previous scrape (None: none arrived)
    ttft_mean_total_s: float | None = None  # since the server started
    ttft_count: float | None = None
    ttft_sum_s: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    preemptions_total: float | None = None
    prefix_cache_hit_rate: float | None = None  # hits / queries since the server started


def unavailable(reason: str) -> RemoteMetricsSnapshot:
    return RemoteMetricsSnapshot(False, f"{CLIENT_SIDE_ONLY} ({reason})", time.time())


def _samples(text: str, model: str | None) -> dict[str, list[float]]:
    """Sample values by sample name, kept only for `model` where the sample carries a model_name label."""
    values: dict[str, list[float]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = sample.labels.get("model_name")
            if model is not None and label is not None and label != model:
                continue
            if sample.name.endswith("_bucket"):
                continue  # the dashboard needs sums and counts, not the bucket layout
            values[sample.name].append(sample.value)
    return values


def parse_vllm_metrics(
    text: str, model: str | None = None, previous: RemoteMetricsSnapshot | None = None
) -> RemoteMetricsSnapshot:
    """A snapshot from Prometheus text. Several engines (data parallel) are summed; the KV usage is averaged."""
    try:
        values = _samples(text, model)
    except Exception as exc:  # the parser raises plain ValueErrors and friends on text it cannot read
        return unavailable(f"its /metrics could not be parsed: {exc}")

    def total(name: str) -> float | None:
        found = values.get(name)
        return sum(found) if found else None

    kv_values = next((values[n] for n in _KV_NAMES if values.get(n)), None)
    running = total("vllm:num_requests_running")
    if kv_values is None and running is None:
        return unavailable("the endpoint serves no vLLM-style /metrics")
    ttft_sum = total("vllm:time_to_first_token_seconds_sum")
    ttft_count = total("vllm:time_to_first_token_seconds_count")
    ttft_total = ttft_sum / ttft_count if ttft_sum is not None and ttft_count else None
    ttft_recent = None
    if previous is not None and previous.ttft_count is not None and ttft_count is not None and ttft_sum is not None:
        new = ttft_count - previous.ttft_count
        if new > 0 and previous.ttft_sum_s is not None:
            ttft_recent = (ttft_sum - previous.ttft_sum_s) / new
    elif previous is None:
        ttft_recent = ttft_total
    queries = total("vllm:prefix_cache_queries_total")
    hits = total("vllm:prefix_cache_hits_total")
    return RemoteMetricsSnapshot(
        available=True,
        message="vLLM-style metrics",
        time=time.time(),
        kv_cache_usage=sum(kv_values) / len(kv_values) if kv_values else None,
        running=running,
        waiting=total("vllm:num_requests_waiting"),
        ttft_mean_s=ttft_recent,
        ttft_mean_total_s=ttft_total,
        ttft_count=ttft_count,
        ttft_sum_s=ttft_sum,
        prompt_tokens_total=total("vllm:prompt_tokens_total"),
        generation_tokens_total=total("vllm:generation_tokens_total"),
        preemptions_total=total("vllm:num_preemptions_total"),
        prefix_cache_hit_rate=hits / queries if hits is not None and queries else None,
    )
