"""Runs a workload through the engine (requests added as they arrive) and collects its own figures."""

from __future__ import annotations

import time

from engine.bench.results import RequestTiming, SystemResult, kv_waste
from engine.bench.workloads import Workload
from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.types import SamplingParams


def run_engine(loaded, workload: Workload, config: EngineConfig, name: str = "engine") -> SystemResult:
    engine = Engine(loaded, config)
    pending = sorted(enumerate(workload.requests), key=lambda item: item[1].arrival_s)
    submitted = {}
    start = time.monotonic()
    while pending or engine.has_unfinished:
        now = time.monotonic()
        while pending and start + pending[0][1].arrival_s <= now:
            index, request = pending.pop(0)
            params = SamplingParams(max_tokens=request.max_new_tokens, ignore_eos=True)
            submitted[index] = engine.add_request(
                request.prompt_ids, params, request_id=f"bench-{index}", arrival_time=start + request.arrival_s
            )
        if engine.has_unfinished:
            engine.step()
        elif pending:
            time.sleep(max(0.0, start + pending[0][1].arrival_s - time.monotonic()))
    wall = max(r.token_times[-1] for r in submitted.values()) - start
    requests = [submitted[i] for i in sorted(submitted)]
    steps = engine.metrics.snapshot().steps
    busy = sum(s.duration_s for s in steps)
    prefill_time = sum(s.duration_s for s in steps if s.prefill_tokens)
    totals = engine.metrics.snapshot().totals
    extra = {
        "steps": len(steps),
        "mean_batch": sum(s.batch_size for s in steps) / len(steps) if steps else 0,
        "peak_pages_used": max((s.pages_used for s in steps), default=0),
        "pages_total": engine.pool.num_pages,
        "kv_waste": kv_waste(steps, engine.pool.page_size),
        "preemptions": totals.preemptions,
        "prefill_tokens": totals.prefill_tokens,
        "prefix_hit_rate": totals.prefix_hit_tokens / totals.prefix_query_tokens if totals.prefix_query_tokens else 0,
        "prefill_step_time_share": prefill_time / busy if busy else 0,
        "overhead_share": sum(s.overhead_s for s in steps) / busy if busy else 0,
    }
    timings = [RequestTiming(r.arrival_time, list(r.token_times)) for r in requests]
    return SystemResult(name, wall, timings, [list(r.output_ids) for r in requests], extra)
