"""The benchmark's accounting on the tiny model: token counts, timings, waste, ratios (never its speed)."""

from __future__ import annotations

import json
import sys

import pytest

from engine.bench import report
from engine.bench.engine_run import exact_length, run_engine
from engine.bench.results import RequestTiming, SystemResult, kv_waste
from engine.bench.runner import BenchPlan, run_benchmark
from engine.bench.workloads import WORKLOADS, build
from engine.core.config import EngineConfig
from engine.core.metrics import StepRecord


def step(pages_used: int, slots_used: int) -> StepRecord:
    return StepRecord(
        step=1, start=0.0, duration_s=0.1, forward_s=0.09, prefill_tokens=0, decode_tokens=1, batch_size=1,
        running=1, waiting=0, pages_used=pages_used, pages_cached_free=0, pages_free=0, pages_total=10,
        kv_slots_used=slots_used, preemptions=0, prefix_query_tokens=0, prefix_hit_tokens=0,
    )  # fmt: skip


def test_kv_waste_is_unused_over_allocated_slots_across_steps() -> None:
    assert kv_waste([step(2, 20), step(4, 60)], page_size=16) == pytest.approx((96 - 80) / 96)
    assert kv_waste([step(0, 0)], page_size=16) is None


def test_timings_and_summary() -> None:
    timing = RequestTiming(arrival=10.0, token_times=[10.5, 10.6, 10.8])
    assert timing.ttft == pytest.approx(0.5) and timing.e2e == pytest.approx(0.8)
    assert timing.inter_token == pytest.approx([0.1, 0.2])
    result = SystemResult("x", wall_s=2.0, timings=[timing, RequestTiming(10.0, [11.0])])
    summary = result.summary()
    assert summary["output_tokens"] == 4 and summary["tokens_per_s"] == 2.0
    assert summary["ttft_p50_s"] == pytest.approx(0.75)


def test_ratios_compare_every_baseline_to_the_engine() -> None:
    rows = [
        {"system": "engine", "tokens_per_s": 200.0, "ttft_p50_s": 0.5},
        {"system": "static", "tokens_per_s": 100.0, "ttft_p50_s": 2.0},
        {"system": "broken", "skipped": "no"},
    ]
    assert report.ratios(rows) == {"static": {"throughput_x": 2.0, "ttft_p50_better_x": 4.0}}
    text = report.table(rows)
    assert "| engine | 200.0 | 0.50s |" in text and "skipped: no" in text


def test_paired_ratios_cancel_a_drift_across_rounds() -> None:
    # the machine slows down round by round; in each round the window makes 95 % of the thread's speed
    thread = [130.0, 115.0, 100.0, 90.0]
    window = [0.95 * x for x in thread]
    window[0], window[1] = window[1], window[0]  # one unlucky round order must not matter either
    result = {
        "tokens_per_s_runs": {"engine-window": window, "engine-thread": thread, "broken": []},
        "ratios": {"engine-thread": {"throughput_x": 0.91}, "broken": {}},
    }
    paired = report.with_paired_ratios(result, "engine-window")["ratios"]
    assert paired["engine-thread"]["throughput_x_paired"] == pytest.approx(0.95)
    assert paired["engine-thread"]["throughput_x"] == 0.91  # the ratio of the medians stays beside it
    assert "throughput_x_paired" not in paired["broken"]  # no runs, no pairs


def test_workloads_have_the_advertised_shapes(tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sizes = {name: build(name, tokenizer) for name in WORKLOADS}
    assert len(sizes["single"].requests) == 1 and sizes["single"].output_tokens == 128
    assert len(sizes["chat8"].requests) == 8 and sizes["chat8"].output_tokens == 8 * 64
    assert len(sizes["chat16"].requests) == 16 and sizes["chat16"].output_tokens == 16 * 64
    assert len(sizes["chat64"].requests) == 64 and sizes["chat64"].output_tokens == 64 * 128
    assert len({tuple(r.prompt_ids) for r in sizes["chat64"].requests}) == 64
    shared = sizes["shared-prefix"].requests
    assert len(shared) == 32 and all(r.prompt_ids[:400] == shared[0].prompt_ids[:400] for r in shared)
    arrivals = sizes["arrivals"]
    assert arrivals.has_arrivals and len({r.max_new_tokens for r in arrivals.requests}) > 1
    # the report's heading says what ran: --scale 0.5 halves the new tokens, and the heading with them
    halved = {name: build(name, tokenizer, scale=0.5) for name in ("single", "sampled", "chat16")}
    assert "64 new tokens" in halved["single"].description and halved["single"].output_tokens == 64
    assert "64 new tokens" in halved["sampled"].description
    assert "32 new tokens each" in halved["chat16"].description and halved["chat16"].output_tokens == 16 * 32


def test_every_system_makes_the_same_tokens_and_the_record_is_json(tiny_loaded) -> None:
    record = run_benchmark(tiny_loaded, ["chat16"], ["sequential", "static", "generate-batch"], scale=0.1)
    record["workloads"].update(run_benchmark(tiny_loaded, ["shared-prefix"], [], scale=0.1)["workloads"])
    chat = record["workloads"]["chat16"]
    expected = chat["output_tokens"]
    for row in chat["systems"]:
        assert not row.get("skipped"), row
        assert row["output_tokens"] == expected, row["system"]
    engine = chat["systems"][0]
    assert engine["system"] == "engine-thread" and engine["via"] == "thread"  # where users run it, by default
    assert 0 <= engine["kv_waste"] < 1 and engine["preemptions"] == 0
    assert engine["runtime"]["forward"] == "lean Llama-family forward"  # the record of what ran
    assert set(chat["ratios"]) == {"hf-generate-sequential", "hf-static-batch", "hf-generate-batch"}
    # greedy, EOS banned in both until max tokens: identical tokens
    assert chat["same_tokens_as"]["hf-generate-sequential"] == 1.0
    assert chat["same_tokens_as"]["hf-static-batch"] == 1.0
    shared = record["workloads"]["shared-prefix"]
    names = [r["system"] for r in shared["systems"]]
    assert names[:2] == ["engine-thread", "engine-no-prefix-cache"]
    cached, uncached = shared["systems"][0], shared["systems"][1]
    assert cached["prefill_tokens"] < uncached["prefill_tokens"] and cached["prefix_hit_rate"] > 0.5
    json.dumps(record)


def test_repeat_runs_every_system_in_rounds_and_keeps_its_median_run(tiny_loaded) -> None:
    seen: list[str] = []
    record = run_benchmark(tiny_loaded, ["single"], ["static"], scale=0.1, repeat=3, progress=seen.append)
    single = record["workloads"]["single"]
    # interleaved rounds: engine, static, engine, static, ... (after the warm-up message)
    labels = [
        m.split(": ")[1].removesuffix(f" (round {n} of 3)")
        for n, m in ((i // 2 + 1, m) for i, m in enumerate(seen[1:]))
    ]
    assert labels == ["engine (its thread)", "static"] * 3
    assert single["repeat"] == 3
    for row in single["systems"]:
        runs = single["tokens_per_s_runs"][row["system"]]
        assert len(runs) == 3
        assert row["tokens_per_s"] == sorted(runs)[1]  # the median run is the one reported
    with pytest.raises(ValueError, match="at least 1"):
        run_benchmark(tiny_loaded, ["single"], [], scale=0.1, repeat=0)


def test_median_run_is_a_real_run() -> None:
    from engine.bench.runner import _median_run

    def result(seconds: float) -> SystemResult:
        return SystemResult("engine", seconds, [RequestTiming(0.0, [seconds / 2, seconds])], [[1, 2]])

    runs = [result(4.0), result(1.0), result(2.0)]
    assert _median_run(runs) is runs[2]
    skipped = SystemResult("llama-cpp-python", 0, [], skipped="not installed")
    assert _median_run([skipped]) is skipped


def test_the_engine_on_its_thread_and_on_the_main_thread_make_the_same_tokens(tiny_loaded) -> None:
    record = run_benchmark(tiny_loaded, ["chat16"], [], scale=0.1, plan=BenchPlan(vias=("thread", "main")))
    chat = record["workloads"]["chat16"]
    assert [r["system"] for r in chat["systems"]] == ["engine-thread", "engine-main"]
    assert chat["same_tokens_as"]["engine-main"] == 1.0
    assert set(chat["ratios"]["engine-main"]) >= {"throughput_x", "itl_p99_better_x"}
    assert all(r["output_tokens"] == chat["output_tokens"] for r in chat["systems"])


def test_the_server_path_drives_inference_studio_serve_with_a_streaming_client(tiny_loaded, tiny_model_dir) -> None:
    serve = [sys.executable, "-m", "app", "serve", "--model", str(tiny_model_dir)]
    plan = BenchPlan(vias=("server", "thread"), serve_command=serve, threads=1)
    record = run_benchmark(tiny_loaded, ["chat16"], ["llama-cpp-server"], scale=0.1, plan=plan)
    chat = record["workloads"]["chat16"]
    server, _thread, llama = chat["systems"]
    assert server["system"] == "engine-server" and server["via"] == "server"
    assert server["output_tokens"] == chat["output_tokens"] and server["ttft_p50_s"] > 0
    assert chat["same_tokens_as"]["engine-thread"] == 1.0  # the same replies, token for token (as text)
    assert llama["skipped"]  # not a GGUF model (and xllamacpp may be missing): said, not faked
    # speculation's counters, from the server's /metrics and from the engine's own records
    for row in (server, _thread):
        assert 0 <= row["accepted_draft_tokens"] <= row["draft_tokens"]


def test_the_sampled_workload_draws_as_a_client_asks_the_same_through_the_server_and_the_thread(
    tiny_loaded, tiny_model_dir
) -> None:
    """temperature 0.8 and top_p 0.95 with a seed, as an OpenAI client sends them: the server and the thread draw the
    same tokens (the server was sent all three), which are not greedy's."""
    (request,) = build("sampled", tiny_loaded.tokenizer, 0.1).requests
    assert (request.temperature, request.top_p, request.seed, request.greedy) == (0.8, 0.95, 1, False)
    params = exact_length(request)
    assert (params.temperature, params.top_p, params.seed, params.min_tokens) == (0.8, 0.95, 1, 12)
    serve = [sys.executable, "-m", "app", "serve", "--model", str(tiny_model_dir)]
    plan = BenchPlan(vias=("server", "thread"), serve_command=serve, threads=1)
    sampled = run_benchmark(tiny_loaded, ["sampled"], [], scale=0.1, plan=plan)["workloads"]["sampled"]
    assert [r["output_tokens"] for r in sampled["systems"]] == [12, 12]
    assert sampled["same_tokens_as"]["engine-thread"] == 1.0
    greedy = build("single", tiny_loaded.tokenizer, 0.1)
    assert greedy.requests[0].prompt_ids == request.prompt_ids and exact_length(greedy.requests[0]).greedy
    sampled_workload = build("sampled", tiny_loaded.tokenizer, 0.1)
    drawn, picked = (run_engine(tiny_loaded, w, EngineConfig()).outputs for w in (sampled_workload, greedy))
    assert drawn != picked  # the same prompt: drawn, not picked


def test_a_chunked_stream_is_timed_per_chunk_and_counted_by_usage() -> None:
    timing = RequestTiming(arrival=1.0, token_times=[1.5, 2.0], tokens=3)  # 3 tokens in 2 chunks
    result = SystemResult("server", 1.0, [timing])
    assert result.output_tokens == 3 and result.summary()["tokens_per_s"] == 3.0


def test_the_json_workload_constrains_every_reply(tiny_loaded) -> None:
    record = run_benchmark(tiny_loaded, ["chat16-json"], [], scale=0.5, plan=BenchPlan(vias=("thread",)))
    row = record["workloads"]["chat16-json"]["systems"][0]
    assert row["system"] == "engine-thread" and row["output_tokens"] > 0
    workload = build("chat16-json", tiny_loaded.tokenizer, 0.5)
    assert all(r.json_schema and '"difficulty"' in r.json_schema for r in workload.requests)


def test_a_benchmarked_server_lets_every_request_wait_its_turn() -> None:
    from engine.bench.runner import BENCH_QUEUE_WAIT_S, server_options

    options = server_options(EngineConfig())
    assert options[options.index("--max-queue-wait") + 1] == str(int(BENCH_QUEUE_WAIT_S))  # not 429 after 120 s
