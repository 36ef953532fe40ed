"""Reading a remote's Prometheus text: vLLM's names (old and new), several engines, TTFT between scrapes."""

from __future__ import annotations

from engine.remote.metrics import CLIENT_SIDE_ONLY, parse_vllm_metrics

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 2.0
vllm:num_requests_running{engine="0",model_name="other"} 9.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 1.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="llama"} 0.5
vllm:gpu_cache_usage_perc{engine="1",model_name="llama"} 0.25
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="llama"} 1.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_count{model_name="llama"} 4.0
vllm:time_to_first_token_seconds_sum{model_name="llama"} 2.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="llama"} 100.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="llama"} 25.0
"""


def test_vllm_text_becomes_a_snapshot() -> None:
    snapshot = parse_vllm_metrics(VLLM_TEXT, model="llama")
    assert snapshot.available and snapshot.running == 5 and snapshot.waiting == 1
    assert snapshot.kv_cache_usage == 0.375  # the average over engines of the older gauge name
    assert snapshot.ttft_mean_total_s == 0.5 and snapshot.ttft_mean_s == 0.5
    assert snapshot.prefix_cache_hit_rate == 0.25
    later = VLLM_TEXT.replace('_count{model_name="llama"} 4.0', '_count{model_name="llama"} 6.0').replace(
        '_sum{model_name="llama"} 2.0', '_sum{model_name="llama"} 3.0'
    )
    assert parse_vllm_metrics(later, model="llama", previous=snapshot).ttft_mean_s == 0.5  # (3 - 2) / (6 - 4)
    assert parse_vllm_metrics(VLLM_TEXT, model="llama", previous=snapshot).ttft_mean_s is None  # nothing new
    assert parse_vllm_metrics(VLLM_TEXT).running == 14  # no model given: every label set counts


def test_other_servers_leave_client_side_timings_only() -> None:
    plain = "# TYPE http_requests counter\nhttp_requests_total 5\n"
    snapshot = parse_vllm_metrics(plain)
    assert not snapshot.available and snapshot.message.startswith(CLIENT_SIDE_ONLY)
    assert snapshot.kv_cache_usage is None and snapshot.running is None
    broken = parse_vllm_metrics("this is { not prometheus")
    assert not broken.available and "could not be parsed" in broken.message
