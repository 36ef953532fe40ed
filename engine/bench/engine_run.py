"""Runs a workload through the engine in-process, stepped where users run it (its EngineThread) or on the caller's
thread, with requests added as they arrive; collects the engine's own figures."""

from __future__ import annotations

import threading
import time

from engine.bench.results import RequestTiming, SystemResult, kv_waste
from engine.bench.workloads import BenchRequest, Workload
from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.core.engine_thread import EngineThread
from engine.core.request import Request
from engine.cycle_collector import set_aside_what_is_loaded
from engine.types import SamplingParams, StructuredKind, StructuredOutput, TokenEvent

VIAS = ("thread", "main", "server")
WAIT_LIMIT_S = 3600.0  # one workload never runs this long; a stuck engine fails the run instead of hanging it


def exact_length(request: BenchRequest) -> SamplingParams:
    """Greedy (or sampled as the request says), exactly max_new_tokens: EOS is banned until then (as transformers'
    min_new_tokens and llama.cpp's ignore_eos do), so every greedy system makes the same tokens. A JSON request ends
    where its JSON does."""
    n = request.max_new_tokens
    if request.json_schema is not None:
        return SamplingParams(
            max_tokens=n, temperature=0.0, structured=StructuredOutput(StructuredKind.JSON_SCHEMA, request.json_schema)
        )
    if not request.greedy:  # sampled as a client asks: exactly n tokens all the same
        return SamplingParams(
            max_tokens=n, min_tokens=n, temperature=request.temperature, top_p=request.top_p, seed=request.seed
        )
    return SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0)


def run_engine(loaded, workload: Workload, config: EngineConfig, name: str = "engine", via: str = "thread"):
    """via "thread": an EngineThread, as the window, `serve` and `generate` run it; "main": step() here."""
    engine = Engine(loaded, config)
    set_aside_what_is_loaded()  # as `serve` and the window do once a model is in service
    if any(r.json_schema is not None for r in workload.requests):
        engine.grammars.warm()  # as `serve` does once idle, before structured requests: not in their first token
    if via == "main":
        timings, outputs, start = _step_here(engine, workload)
    elif via == "thread":
        timings, outputs, start = _in_engine_thread(engine, workload)
    else:
        raise ValueError(f"run_engine runs the engine in-process: 'thread' or 'main', not {via!r}")
    wall = max(t.token_times[-1] for t in timings) - start
    return SystemResult(name, wall, timings, outputs, {"via": via, **engine_figures(engine)})


def _step_here(engine: Engine, workload: Workload) -> tuple[list[RequestTiming], list[list[int]], float]:
    pending = sorted(enumerate(workload.requests), key=lambda item: item[1].arrival_s)
    submitted: dict[int, Request] = {}
    start = time.monotonic()
    while pending or engine.has_unfinished:
        now = time.monotonic()
        while pending and start + pending[0][1].arrival_s <= now:
            index, request = pending.pop(0)
            submitted[index] = engine.add_request(
                request.prompt_ids, exact_length(request), f"bench-{index}", arrival_time=start + request.arrival_s
            )
        if engine.has_unfinished:
            engine.step()
        elif pending:
            time.sleep(max(0.0, start + pending[0][1].arrival_s - time.monotonic()))
    requests = [submitted[i] for i in sorted(submitted)]
    timings = [RequestTiming(r.arrival_time, list(r.token_times)) for r in requests]
    return timings, [list(r.output_ids) for r in requests], start


def _in_engine_thread(engine: Engine, workload: Workload) -> tuple[list[RequestTiming], list[list[int]], float]:
    times: dict[str, list[float]] = {f"bench-{i}": [] for i in range(len(workload.requests))}
    outputs: dict[str, list[int]] = {rid: [] for rid in times}
    finished = threading.Event()
    remaining = [len(times)]

    def listen(events: list[TokenEvent]) -> None:  # the engine thread, right after each step
        for event in events:
            if event.request_id in times:
                times[event.request_id].extend([event.time] * len(event.token_ids))
                outputs[event.request_id].extend(event.token_ids)
                if event.finished:
                    remaining[0] -= 1
                    if event.error:
                        raise RuntimeError(f"{event.request_id} failed: {event.error}")
        if remaining[0] == 0:
            finished.set()

    worker = EngineThread(engine, name="bench-engine")
    arrivals: dict[str, float] = {}
    with worker:
        start = time.monotonic()
        for index, request in sorted(enumerate(workload.requests), key=lambda item: item[1].arrival_s):
            time.sleep(max(0.0, start + request.arrival_s - time.monotonic()))
            arrivals[f"bench-{index}"] = time.monotonic()
            worker.submit(request.prompt_ids, params=exact_length(request), request_id=f"bench-{index}", sink=listen)
        if not finished.wait(WAIT_LIMIT_S):
            raise TimeoutError(f"the engine thread did not finish the workload within {WAIT_LIMIT_S:.0f} s")
    ids = [f"bench-{i}" for i in range(len(workload.requests))]
    return [RequestTiming(arrivals[r], times[r]) for r in ids], [outputs[r] for r in ids], start


def engine_figures(engine: Engine) -> dict:
    """What the engine's own step records say about a run: pages, waste, preemptions, prefill, stalls."""
    snapshot = engine.metrics.snapshot()
    steps, totals = snapshot.steps, snapshot.totals
    busy = sum(s.duration_s for s in steps)
    prefill_time = sum(s.duration_s for s in steps if s.prefill_tokens)
    stalls = [s.prefill_stall_s for s in steps if s.prefill_stall_s > 0]
    return {
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
        "prefill_stall_max_s": max(stalls, default=0.0),
        "draft_tokens": totals.draft_tokens,
        "accepted_draft_tokens": totals.accepted_tokens,
        "runtime": engine.runtime_record(),
    }
