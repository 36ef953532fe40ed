"""The one-click experiments, run headless on the tiny model with small sizes: their tables and what they prove."""

from __future__ import annotations

import threading

import pytest

from engine.core.config import EngineConfig
from engine.experiments.catalog import EXPERIMENTS, experiment
from engine.experiments.plumbing import ExperimentCancelled, ExperimentContext, ExperimentSizes
from engine.load.options import LoadOptions


@pytest.fixture
def context(tiny_loaded):
    phases: list[str] = []
    ctx = ExperimentContext(
        tiny_loaded, EngineConfig(), ExperimentSizes.small(), on_phase=lambda source, label: phases.append(label)
    )
    ctx.phases = phases  # type: ignore[attr-defined]
    return ctx


def test_prefill_vs_decode_times_both_phases(context) -> None:
    result = experiment("prefill_vs_decode").run(context)
    assert [row[0].split()[0] for row in result.rows] == ["prefill", "decode"]
    figures = result.figures[0]
    assert figures["prompt_tokens"] >= 48
    assert figures["prefill_tokens_per_s"] > 0 and figures["decode_tokens_per_s"] > 0
    assert context.phases == ["experiment: prefill vs decode"]


def test_batching_runs_each_concurrency(context) -> None:
    result = experiment("batching").run(context)
    assert [f["streams"] for f in result.figures] == [1, 3]
    assert all(f["tokens_per_s"] > 0 for f in result.figures)
    assert [row[0] for row in result.rows] == ["1", "3"]


def test_batching_measures_stream_speed_and_throughput_on_one_clock(context) -> None:
    """One request alone is the whole engine's output: its speed cannot exceed the throughput (a per-stream decode
    pace that left out the prefill and the first token once read 2.9 against a throughput of 2.1 tok/s)."""
    result = experiment("batching").run(context)
    alone, together = result.figures
    assert alone["per_stream_tokens_per_s"] <= alone["tokens_per_s"]
    assert alone["per_stream_tokens_per_s"] == pytest.approx(alone["tokens_per_s"])
    assert result.rows[0][1] == result.rows[0][2]  # the table shows the same figure twice
    assert 0 < together["per_stream_tokens_per_s"] <= together["tokens_per_s"]
    assert "One request alone streams at exactly the engine's throughput" in result.notes[-1]


def test_prefix_sharing_hits_the_cache_only_when_caching_is_on(context) -> None:
    result = experiment("prefix_sharing").run(context)
    on, off = result.figures
    assert on["caching"] and not off["caching"]
    assert on["cached_tokens"] > 0 and off["cached_tokens"] == 0
    assert on["prefill_tokens"] < off["prefill_tokens"] == off["prompt_tokens"]
    assert context.phases == ["experiment: prefix sharing, caching on", "experiment: prefix sharing, caching off"]


def test_memory_pressure_preempts_and_keeps_the_replies(context) -> None:
    result = experiment("memory_pressure").run(context)
    ample, tight = result.figures
    assert ample["preemptions"] == 0 and tight["preemptions"] > 0
    assert tight["kv_pages"] < ample["kv_pages"]
    assert tight["identical_outputs"]


def test_quantization_compares_two_loaded_variants(context) -> None:
    from engine.experiments.catalog import quantization

    result = quantization(context, LoadOptions(dtype="bfloat16"))
    assert [f["variant"] for f in result.figures] == ["float32", "bfloat16"]
    assert result.figures[1]["weight_bytes"] < result.figures[0]["weight_bytes"]
    assert len(result.rows) == 2


def test_the_quantization_experiment_picks_a_variant_the_source_can_load() -> None:
    from engine.experiments.catalog import _alternative_for

    auto = LoadOptions(device="cpu")
    assert _alternative_for(auto, "gguf-file").quantization == "int8"  # nf4 is for safetensors models
    assert _alternative_for(LoadOptions(quantization="int4", device="cpu"), "embedded").quantization == "none"


def test_a_cancelled_experiment_stops_and_frees_its_requests(context) -> None:
    context.cancelled = threading.Event()
    context.cancelled.set()
    with pytest.raises(ExperimentCancelled):
        experiment("batching").run(context)


def test_every_experiment_has_a_title_and_description() -> None:
    assert [e.key for e in EXPERIMENTS] == [
        "prefill_vs_decode",
        "batching",
        "prefix_sharing",
        "memory_pressure",
        "capacity",
        "quantization",
    ]
    assert all(e.title and e.description for e in EXPERIMENTS)


def test_batching_has_room_for_every_request_at_once(context) -> None:
    context.sizes = ExperimentSizes(batch_sizes=(1, 7), batch_reply_tokens=9, page_size=4)
    result = experiment("batching").run(context)
    assert [f["streams"] for f in result.figures] == [1, 7]
    assert [f["preemptions"] for f in result.figures] == [0, 0]  # the pool is sized per request, pages rounded up
