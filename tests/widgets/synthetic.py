"""Synthetic metrics for dashboard tests: a fake recorder whose steps, tokens and page map are known exactly."""

from __future__ import annotations

from dataclasses import replace

from engine.core.metrics import MetricsRecorder, PageMap, StepRecord, TokenRecord


def step(
    number: int,
    start: float,
    *,
    duration: float = 0.05,
    forward: float = 0.04,
    prefill: int = 0,
    decode: int = 0,
    running: int = 1,
    waiting: int = 0,
    used: int = 4,
    cached: int = 0,
    total: int = 32,
    slots: int | None = None,
    preemptions: int = 0,
    query: int = 0,
    hit: int = 0,
    admitted: tuple[str, ...] = (),
    finished: tuple[str, ...] = (),
    preempted: tuple[str, ...] = (),
) -> StepRecord:
    return StepRecord(
        step=number,
        start=start,
        duration_s=duration,
        forward_s=forward,
        prefill_tokens=prefill,
        decode_tokens=decode,
        batch_size=max(1, decode + (1 if prefill else 0)),
        running=running,
        waiting=waiting,
        pages_used=used,
        pages_cached_free=cached,
        pages_free=total - used - cached,
        pages_total=total,
        kv_slots_used=used * 4 if slots is None else slots,
        preemptions=preemptions,
        prefix_query_tokens=query,
        prefix_hit_tokens=hit,
        admitted=admitted,
        finished=finished,
        preempted=preempted,
    )


def token(request_id: str, tag: str, time: float, index: int, latency: float) -> TokenRecord:
    return TokenRecord(request_id, tag, time, index, latency)


def page_map(
    tables: dict[str, tuple[list[int], int]], num_pages: int, cached: set[int], tags: dict[str, str]
) -> PageMap:
    """A page map of 4-token pages: request id -> (its page table, tokens computed)."""
    rows = tuple((rid, tuple(table), computed) for rid, (table, computed) in tables.items())
    return PageMap(4, num_pages, rows, frozenset(cached), dict(tags))


def two_chat_recorder(t0: float = 1000.0) -> MetricsRecorder:
    """Two chats: 'alpha' (req-a, prompt 20 tokens, TTFT 0.10 s, 5 tokens 0.05 s apart) and 'beta' (req-b, admitted
    0.2 s later, 40-token prompt with 16 of them from the prefix cache, TTFT 0.15 s, 3 tokens 0.08 s apart); one
    preemption of req-b at step 6. Page map: req-a holds pages 0-2, req-b holds 0-1 (shared) and 3; 4 is cached."""
    rec = MetricsRecorder()
    steps = [
        step(1, t0 + 0.00, duration=0.10, forward=0.09, prefill=20, running=1, admitted=("req-a",), query=20),
        step(2, t0 + 0.10, decode=1, running=1),
        step(3, t0 + 0.20, duration=0.10, forward=0.08, prefill=24, decode=1, running=2, admitted=("req-b",)),
        step(4, t0 + 0.30, decode=2, running=2, query=40, hit=16),
        step(5, t0 + 0.35, decode=2, running=2),
        step(6, t0 + 0.40, decode=2, running=1, waiting=1, preemptions=1, preempted=("req-b",)),
        step(7, t0 + 0.45, decode=1, running=1, finished=("req-a",)),
    ]
    for record in steps:
        rec.record_step(record)
    rec.record_tokens(
        [token("req-a", "alpha", t0 + 0.10, 0, 0.10)]
        + [token("req-a", "alpha", t0 + 0.10 + 0.05 * i, i, 0.05) for i in range(1, 5)]
        + [token("req-b", "beta", t0 + 0.35, 0, 0.15)]
        + [token("req-b", "beta", t0 + 0.35 + 0.08 * i, i, 0.08) for i in range(1, 3)]
    )
    rec.record_finished({"request_id": "req-a", "tag": "alpha", "prompt_tokens": 20, "output_tokens": 5, "ttft_s": 0.1})
    rec.publish_page_map(
        page_map(
            {"req-a": ([0, 1, 2], 10), "req-b": ([0, 1, 3], 9)},  # pages 0-1 shared, 2 half full, 3 a quarter
            num_pages=6,
            cached={0, 1, 4},
            tags={"req-a": "alpha", "req-b": "beta"},
        )
    )
    return rec


def shifted(record: StepRecord, dt: float) -> StepRecord:
    return replace(record, start=record.start + dt)
