"""What a remote endpoint's /metrics says of the server: vLLM's names (also what the studio serves), llama.cpp's
server's and TGI's, each read for what it offers (KV-cache usage, running and waiting requests, TTFT, throughput)."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from engine.remote.metric_dialects import DIALECTS, Samples

CLIENT_SIDE_ONLY = "only client-side timings are available"


@dataclass(frozen=True)
class RemoteMetricsSnapshot:
    """One scrape. When `available` is False, `message` says why and every figure is None."""

    available: bool
    message: str
    time: float
    kv_cache_usage: float | None = None  # 0..1
    running: float | None = None  # requests being computed (llama.cpp: processing; TGI: the current batch)
    waiting: float | None = None  # requests queued (llama.cpp: deferred; TGI: the queue)
    ttft_mean_s: float | None = None  # mean TTFT of requests since the previous scrape (None: none arrived)
    ttft_mean_total_s: float | None = None  # since the server started
    ttft_count: float | None = None
    ttft_sum_s: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    preemptions_total: float | None = None
    prefix_cache_hit_rate: float | None = None  # hits / queries since the server started
    server: str = ""  # "vLLM", "llama.cpp", "TGI": whose metric names the endpoint speaks
    offers: tuple[str, ...] = ()  # what it reports, in words
    lacks: tuple[str, ...] = ()  # what the dashboard would show that it does not report
    generation_tokens_per_s: float | None = None  # everyone's output tokens per second since the previous scrape
    time_per_token_s: float | None = None  # TGI: mean time per output token since the server started
    cached_prompt_tokens_total: float | None = None  # llama.cpp: prompt tokens reused from its cache
    speculative_accepted_total: float | None = None  # llama.cpp: draft tokens the model accepted
    speculative_drafted_total: float | None = None
    busy_slots_per_decode: float | None = None  # llama.cpp: its batching, as slots busy per decode call


def unavailable(reason: str) -> RemoteMetricsSnapshot:
    return RemoteMetricsSnapshot(False, f"{CLIENT_SIDE_ONLY} ({reason})", time.time())


def _samples(text: str, model: str | None) -> Samples:
    """Sample values by sample name, kept only for `model` where the sample carries a model label."""
    values: dict[str, list[float]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = sample.labels.get("model_name", sample.labels.get("model"))
            if model is not None and label is not None and label != model:
                continue
            if sample.name.endswith("_bucket"):
                continue  # the dashboard needs sums and counts, not the bucket layout
            values[sample.name].append(sample.value)
    return values


def parse_metrics(
    text: str, model: str | None = None, previous: RemoteMetricsSnapshot | None = None
) -> RemoteMetricsSnapshot:
    """A snapshot from Prometheus text, in whichever known dialect it speaks. Several engines (data parallel) are
    summed; a KV usage is averaged; rates need the previous scrape."""
    try:
        values = _samples(text, model)
    except Exception as exc:  # the parser raises plain ValueErrors and friends on text it cannot read
        return unavailable(f"its /metrics could not be parsed: {exc}")
    now = time.time()
    for dialect in DIALECTS:
        if dialect.speaks(values):
            figures = dialect.read(values, previous)
            figures.update(_rates(figures, previous, now))
            offers, lacks = dialect.describe(figures)
            message = f"{dialect.server} metrics: " + ", ".join(offers)
            return RemoteMetricsSnapshot(
                True, message, now, server=dialect.server, offers=offers, lacks=lacks, **figures
            )
    return unavailable("the endpoint serves no vLLM, llama.cpp or TGI metrics")


def _rates(figures: dict, previous: RemoteMetricsSnapshot | None, now: float) -> dict:
    total = figures.get("generation_tokens_total")
    if previous is None or total is None or previous.generation_tokens_total is None:
        return {}
    elapsed = now - previous.time
    produced = total - previous.generation_tokens_total
    if elapsed <= 0 or produced < 0:  # a restarted server starts its counters again
        return {}
    return {"generation_tokens_per_s": produced / elapsed}


# the name the rest of the studio has used since vLLM was the only dialect read
parse_vllm_metrics = parse_metrics
