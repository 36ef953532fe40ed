"""What the engine did, step by step: StepRecord, per-token records, totals; a ring buffer other threads read."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass, field

from engine.types import FinishReason


@dataclass(frozen=True)
class StepRecord:
    step: int
    start: float  # time.monotonic() when the step began
    duration_s: float
    forward_s: float
    prefill_tokens: int
    decode_tokens: int
    batch_size: int  # sequences in the step
    running: int
    waiting: int
    pages_used: int
    pages_cached_free: int  # free pages still holding a reusable prefix
    pages_free: int  # free pages with nothing cached
    pages_total: int
    kv_slots_used: int  # token slots actually filled in used pages
    preemptions: int  # in this step
    prefix_query_tokens: int
    prefix_hit_tokens: int
    prefill_stall_s: float = 0.0  # how much longer the decoding streams waited because of this step's prefill
    prefill_allowed: int = 0  # prefill tokens the step was allowed beside its decode rows
    weight_format: str = ""  # the format the step's linears ran in (the fastest for its batch size)
    draft_tokens: int = 0  # speculative tokens verified this step
    accepted_tokens: int = 0  # of them, kept (each saved a decode step)
    admitted: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()

    @property
    def overhead_s(self) -> float:
        return max(0.0, self.duration_s - self.forward_s)

    @property
    def prefill_share(self) -> float:
        total = self.prefill_tokens + self.decode_tokens
        return self.prefill_tokens / total if total else 0.0


@dataclass(frozen=True)
class TokenRecord:
    request_id: str
    tag: str
    time: float
    index: int  # 0 = first token (its latency is the TTFT)
    latency_s: float  # since the previous token, or since arrival for the first
    drafted: bool = False  # an accepted speculative draft token (it came in the same step as the one before it)


class PageMap:
    """Who holds each page right now: owner tags per page, shared and cached flags.

    The engine thread only copies each running request's page table; the per-page views are built on
    first use, in the reader's thread, so publishing costs the engine almost nothing."""

    def __init__(
        self,
        page_size: int,
        num_pages: int,
        tables: tuple[tuple[str, tuple[int, ...], int], ...],  # (request id, page table, tokens computed)
        cached_pages: frozenset[int],
        tags: dict[str, str],
    ) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self.tables = tables
        self.cached_pages = cached_pages
        self.tags = tags  # request id -> tag (chat name)
        self._owners: tuple[tuple[str, ...], ...] | None = None
        self._filled: tuple[int, ...] | None = None
        self._by_request: dict[str, tuple[int, ...]] | None = None

    def _build(self) -> None:
        owners: list[list[str]] = [[] for _ in range(self.num_pages)]
        filled = [0] * self.num_pages
        ps = self.page_size
        for request_id, table, computed in self.tables:
            for index, page in enumerate(table):
                owners[page].append(request_id)
                filled[page] = max(filled[page], min(ps, max(0, computed - index * ps)))
        self._owners = tuple(tuple(o) for o in owners)
        self._filled = tuple(filled)

    @property
    def owners(self) -> tuple[tuple[str, ...], ...]:
        """Request ids holding each page (several when the page is a shared prefix)."""
        if self._owners is None:
            self._build()
        return self._owners

    @property
    def filled(self) -> tuple[int, ...]:
        """Tokens written in each page."""
        if self._filled is None:
            self._build()
        return self._filled

    def table_of(self, request_id: str | None) -> tuple[int, ...] | None:
        """The pages a running request holds, or None (built once per map: every chat tab asks)."""
        if request_id is None:
            return None
        if self._by_request is None:
            self._by_request = {rid: table for rid, table, _computed in self.tables}
        return self._by_request.get(request_id)

    @property
    def cached(self) -> tuple[bool, ...]:
        """Whether each page holds a full, hashed prefix page (findable by later requests)."""
        return tuple(p in self.cached_pages for p in range(self.num_pages))


@dataclass
class Totals:
    steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefill_stall_s: float = 0.0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    requests_finished: int = 0
    requests_failed: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricsSnapshot:
    steps: list[StepRecord]
    tokens: list[TokenRecord]
    finished: list[dict]  # RequestStats as dicts, with request_id and tag
    totals: Totals
    page_map: PageMap | None
    next_step: int
    next_token: int
    next_finished: int = 0  # the cursor for the finished requests after these


def _tail(buffer: deque, next_seq: int, since: int) -> list:
    """Records numbered >= since; the buffer holds the numbers [next_seq - len, next_seq)."""
    skip = max(0, since - (next_seq - len(buffer)))
    return list(itertools.islice(buffer, skip, None)) if skip < len(buffer) else []


class MetricsRecorder:
    """Written by the engine thread, read by anyone: each read copies only what is new since a cursor."""

    def __init__(self, capacity: int = 8192) -> None:
        self._lock = threading.Lock()
        self._steps: deque[StepRecord] = deque(maxlen=capacity)
        self._tokens: deque[TokenRecord] = deque(maxlen=capacity * 8)
        self._finished: deque[dict] = deque(maxlen=4096)
        self._totals = Totals()
        self._page_map: PageMap | None = None
        self._step_seq = 0
        self._token_seq = 0
        self._finished_seq = 0

    def record_step(self, record: StepRecord) -> None:
        with self._lock:
            self._steps.append(record)
            self._step_seq += 1
            t = self._totals
            t.steps += 1
            t.prefill_tokens += record.prefill_tokens
            t.preemptions += record.preemptions
            t.prefix_query_tokens += record.prefix_query_tokens
            t.prefix_hit_tokens += record.prefix_hit_tokens
            t.prefill_stall_s += record.prefill_stall_s
            t.draft_tokens += record.draft_tokens
            t.accepted_tokens += record.accepted_tokens

    def record_tokens(self, records: list[TokenRecord]) -> None:
        with self._lock:
            self._tokens.extend(records)
            self._token_seq += len(records)
            self._totals.generation_tokens += len(records)

    def record_finished(self, stats: dict) -> None:
        with self._lock:
            self._finished.append(stats)
            self._finished_seq += 1
            t = self._totals
            t.requests_finished += 1
            t.prompt_tokens += stats.get("prompt_tokens", 0)
            reason = stats.get("finish_reason", "unknown")
            t.finish_reasons[reason] = t.finish_reasons.get(reason, 0) + 1
            if reason == FinishReason.ERROR:
                t.requests_failed += 1

    def publish_page_map(self, page_map: PageMap) -> None:
        with self._lock:
            self._page_map = page_map

    def snapshot(self, since_step: int = 0, since_token: int = 0, since_finished: int = 0) -> MetricsSnapshot:
        """Records from the given cursors on (0: every one the buffers still hold)."""
        with self._lock:
            steps = _tail(self._steps, self._step_seq, since_step)
            tokens = _tail(self._tokens, self._token_seq, since_token)
            t = self._totals
            totals = Totals(**{**t.__dict__, "finish_reasons": dict(t.finish_reasons)})
            return MetricsSnapshot(
                steps=steps,
                tokens=tokens,
                finished=_tail(self._finished, self._finished_seq, since_finished),
                totals=totals,
                page_map=self._page_map,
                next_step=self._step_seq,
                next_token=self._token_seq,
                next_finished=self._finished_seq,
            )

    def clear(self) -> None:
        with self._lock:
            self._steps.clear()
            self._tokens.clear()
            self._finished.clear()
