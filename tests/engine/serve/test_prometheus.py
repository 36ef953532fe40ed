"""EngineCollector: vLLM's metric names over the MetricsRecorder, counters and histograms that add up."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine.serve.prometheus import EngineCollector, LiveState, live_state_of
from engine.types import SamplingParams


def scrape(collector: EngineCollector) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        s.name + (f"[{s.labels['le']}]" if "le" in s.labels else ""): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("model_name") == "tiny"
    }


def test_counters_gauges_and_histograms_add_up(make_engine) -> None:
    from engine.core.engine_thread import EngineThread

    with EngineThread(make_engine(kv_pages=64, page_size=4)) as worker:
        collector = EngineCollector(worker.metrics, "tiny")  # no live state: gauges from the last step
        empty = scrape(collector)
        assert empty["vllm:num_requests_running"] == 0 and empty["vllm:prompt_tokens_total"] == 0
        for _ in range(3):  # one after the other: the later ones find the first one's pages in the prefix cache
            worker.submit([5, 6, 7, 8, 9], params=SamplingParams(max_tokens=6, ignore_eos=True)).result(timeout=60)
        metrics = scrape(collector)
        live = worker.call(live_state_of).result(timeout=10)
    assert live == LiveState(0, 0, 0, 64)
    assert metrics["vllm:prompt_tokens_total"] == 15 and metrics["vllm:generation_tokens_total"] == 18
    assert metrics["vllm:time_to_first_token_seconds_count"] == 3
    assert metrics["vllm:inter_token_latency_seconds_count"] == 15
    assert metrics["vllm:time_to_first_token_seconds_bucket[+Inf]"] == 3
    assert metrics["vllm:prefix_cache_queries_total"] >= metrics["vllm:prefix_cache_hits_total"] > 0
    assert metrics["vllm:request_success_total"] == 3
    assert metrics["vllm:num_requests_running"] == 0 and metrics["vllm:kv_cache_usage_perc"] == 0
    # histograms accumulate across scrapes instead of recounting the ring buffer
    assert scrape(collector)["vllm:time_to_first_token_seconds_count"] == 3


def test_live_state_wins_over_the_last_step(make_engine) -> None:
    engine = make_engine()
    collector = EngineCollector(engine.metrics, "tiny", live=lambda: LiveState(2, 5, 16, 64))
    metrics = scrape(collector)
    assert metrics["vllm:num_requests_running"] == 2 and metrics["vllm:num_requests_waiting"] == 5
    assert metrics["vllm:kv_cache_usage_perc"] == 0.25


def test_the_record_of_what_runs_is_an_info_metric(make_engine) -> None:
    engine = make_engine()
    collector = EngineCollector(engine.metrics, "tiny", runtime=engine.runtime_record())
    registry = CollectorRegistry()
    registry.register(collector)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    (sample,) = families["inference_studio_engine_info"].samples
    assert sample.value == 1 and sample.labels["model_name"] == "tiny"
    assert sample.labels["forward"] == "lean Llama-family forward"
    assert sample.labels["fast_path_check"].startswith("agrees with transformers")
    assert "fused QKV" in sample.labels["kernels"] and sample.labels["weights"] == "float32"
    (stall,) = families["inference_studio_prefill_stall_seconds"].samples
    assert stall.value == 0
