"""The metric names of the servers the studio reads: vLLM (and the studio itself, which speaks vLLM's), llama.cpp's
llama-server and Hugging Face TGI; each turns its samples into the snapshot's figures and says what it offers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Samples = dict[str, list[float]]

# what the dashboard shows, in words, with the figure it needs
_FIGURE_WORDS = (
    ("kv_cache_usage", "KV-cache usage"),
    ("running", "running requests"),
    ("waiting", "waiting requests"),
    ("ttft_mean_total_s", "time to first token"),
    ("generation_tokens_total", "generated tokens (throughput)"),
    ("prompt_tokens_total", "prompt tokens"),
    ("prefix_cache_hit_rate", "prefix-cache hits"),
    ("cached_prompt_tokens_total", "prompt tokens from its cache"),
    ("preemptions_total", "preemptions"),
    ("time_per_token_s", "time per output token"),
    ("speculative_accepted_total", "speculative decoding"),
    ("busy_slots_per_decode", "busy slots per decode"),
)
# what a user of the dashboard misses when a server does not report it
_WANTED = ("kv_cache_usage", "running", "waiting", "ttft_mean_total_s")


def total(values: Samples, name: str) -> float | None:
    found = values.get(name)
    return sum(found) if found else None


def mean(values: Samples, name: str) -> float | None:
    found = values.get(name)
    return sum(found) / len(found) if found else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


@dataclass(frozen=True)
class Dialect:
    server: str
    marker: str  # a name prefix only this server uses
    read: Callable[[Samples, object], dict]

    def speaks(self, values: Samples) -> bool:
        return any(name.startswith(self.marker) for name in values)

    def describe(self, figures: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
        offers = tuple(words for key, words in _FIGURE_WORDS if figures.get(key) is not None)
        lacks = tuple(words for key, words in _FIGURE_WORDS if key in _WANTED and figures.get(key) is None)
        return offers, lacks


def _ttft_since(previous, ttft_sum: float | None, ttft_count: float | None) -> float | None:
    """Mean TTFT of the requests that arrived since the previous scrape (all of them at the first scrape)."""
    if previous is None:
        return ratio(ttft_sum, ttft_count)
    if previous.ttft_count is None or previous.ttft_sum_s is None or ttft_count is None or ttft_sum is None:
        return None
    new = ttft_count - previous.ttft_count
    return (ttft_sum - previous.ttft_sum_s) / new if new > 0 else None


def read_vllm(values: Samples, previous) -> dict:
    # older vLLM versions called the KV-cache gauge gpu_cache_usage_perc
    kv = mean(values, "vllm:kv_cache_usage_perc")
    if kv is None:
        kv = mean(values, "vllm:gpu_cache_usage_perc")
    ttft_sum = total(values, "vllm:time_to_first_token_seconds_sum")
    ttft_count = total(values, "vllm:time_to_first_token_seconds_count")
    return {
        "kv_cache_usage": kv,
        "running": total(values, "vllm:num_requests_running"),
        "waiting": total(values, "vllm:num_requests_waiting"),
        "ttft_mean_s": _ttft_since(previous, ttft_sum, ttft_count),
        "ttft_mean_total_s": ratio(ttft_sum, ttft_count),
        "ttft_count": ttft_count,
        "ttft_sum_s": ttft_sum,
        "prompt_tokens_total": total(values, "vllm:prompt_tokens_total"),
        "generation_tokens_total": total(values, "vllm:generation_tokens_total"),
        "preemptions_total": total(values, "vllm:num_preemptions_total"),
        "prefix_cache_hit_rate": ratio(
            total(values, "vllm:prefix_cache_hits_total"), total(values, "vllm:prefix_cache_queries_total")
        ),
        **_speculation(values, "vllm:"),
    }


def _speculation(values: Samples, prefix: str) -> dict:
    """Drafted and accepted tokens (vLLM's and llama.cpp's names match but for the prefix); counted even while
    speculation is off (all zero), so reported as an offer only when it drafted something."""
    drafted = total(values, f"{prefix}spec_decode_num_draft_tokens_total")
    accepted = total(values, f"{prefix}spec_decode_num_accepted_tokens_total")
    return {"speculative_accepted_total": accepted if drafted else None, "speculative_drafted_total": drafted or None}


def read_llama_cpp(values: Samples, _previous) -> dict:
    """llama-server's /metrics (with --metrics): requests processing and deferred (queued for a free slot), token
    counters, speculative decoding; the KV usage gauge only in versions that still have it."""
    return {
        "kv_cache_usage": mean(values, "llamacpp:kv_cache_usage_ratio"),
        "running": total(values, "llamacpp:requests_processing"),
        "waiting": total(values, "llamacpp:requests_deferred"),
        "prompt_tokens_total": total(values, "llamacpp:prompt_tokens_total"),
        "generation_tokens_total": total(values, "llamacpp:tokens_predicted_total"),
        "cached_prompt_tokens_total": total(values, "llamacpp:prompt_tokens_cached_total"),
        **_speculation(values, "llamacpp:"),
        "busy_slots_per_decode": mean(values, "llamacpp:n_busy_slots_per_decode"),
    }


def read_tgi(values: Samples, _previous) -> dict:
    """TGI's /metrics: its current batch (running) and queue (waiting), request and token histograms."""
    return {
        "running": total(values, "tgi_batch_current_size"),
        "waiting": total(values, "tgi_queue_size"),
        "prompt_tokens_total": total(values, "tgi_request_input_length_sum"),
        "generation_tokens_total": total(values, "tgi_request_generated_tokens_sum"),
        "time_per_token_s": ratio(
            total(values, "tgi_request_mean_time_per_token_duration_sum"),
            total(values, "tgi_request_mean_time_per_token_duration_count"),
        ),
    }


DIALECTS = (
    Dialect("vLLM", "vllm:", read_vllm),
    Dialect("llama.cpp", "llamacpp:", read_llama_cpp),
    Dialect("TGI", "tgi_", read_tgi),
)
