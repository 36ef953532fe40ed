"""Dashboard figures without Qt: percentiles, rates, the prefill/decode split, KV waste, the numbers panel's summary."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.core.metrics import PageMap
from widgets.dashboard.data.series import MemoryInfo, WindowView


def percentile(values: np.ndarray, q: float) -> float | None:
    """The q-th percentile (linear interpolation between ranks, numpy's default), or None without data."""
    values = np.asarray(values, dtype=float)
    return float(np.percentile(values, q)) if values.size else None


@dataclass(frozen=True)
class StepTimeSplit:
    """Seconds of each step spent on prefill, on decode, and outside the forward pass.

    Prefill and decode tokens of one step run in one packed forward pass, so the pass is not timed per
    kind: a mixed step's forward time is apportioned by token count (pure steps are exact)."""

    t: np.ndarray
    prefill_s: np.ndarray
    decode_s: np.ndarray
    other_s: np.ndarray


def step_time_split(view: WindowView) -> StepTimeSplit:
    s = view.steps
    prefill, decode, forward = s["prefill_tokens"], s["decode_tokens"], s["forward_s"]
    total = prefill + decode
    share = np.divide(prefill, total, out=np.zeros_like(forward), where=total > 0)
    other = np.maximum(0.0, s["duration_s"] - forward)
    return StepTimeSplit(s["t"], forward * share, forward * (1.0 - share), other)


def token_rate(view: WindowView, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Output tokens per second of the whole engine across the window: (bin centres, rate).

    Bins sit on whole multiples of bin_s counted from the first record, so a bar keeps its height as the window
    scrolls; the newest bin is still filling and is divided by the time it has had (left out while too short)."""
    shift = view.since_origin  # window time + shift = time since the first record
    first = math.floor((view.start + shift) / bin_s) * bin_s - shift
    edges = np.arange(first, view.end + bin_s, bin_s)
    if len(edges) < 2:
        return np.empty(0), np.empty(0)
    counts, _ = np.histogram(view.tokens["t"], bins=edges)
    widths = np.minimum(edges[1:], view.end) - np.maximum(edges[:-1], view.start)
    keep = widths >= bin_s * 0.25
    centres = (edges[:-1] + edges[1:]) / 2
    return centres[keep], counts[keep] / widths[keep]


def bin_width_for(window_s: float) -> float:
    """About 30 bins across the window, at least a second each: fewer would hide changes, more shows noise."""
    return max(1.0, window_s / 30)


@dataclass(frozen=True)
class ChatLatencies:
    """One chat's tokens in a window: inter-token latencies of its later tokens, TTFTs of its first ones."""

    t: np.ndarray
    itl_s: np.ndarray
    joined: np.ndarray  # joined[i]: point i and i + 1 belong to the same reply (a line between replies means nothing)
    first_t: np.ndarray
    ttft_s: np.ndarray
    drafted: np.ndarray  # drafted[i]: later token i was an accepted speculative draft


def chat_latencies(view: WindowView, chat: int) -> ChatLatencies:
    tok = view.tokens
    mine = tok["chat"] == chat
    first = mine & (tok["index"] == 0)
    later = mine & (tok["index"] > 0)
    requests = tok["request"][later]
    joined = np.append(requests[1:] == requests[:-1], False) if requests.size else np.empty(0, dtype=bool)
    drafted = tok["drafted"][later] > 0.5
    return ChatLatencies(
        tok["t"][later], tok["latency_s"][later], joined, tok["t"][first], tok["latency_s"][first], drafted
    )


def itl_histogram(latencies_s: np.ndarray, bins: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Histogram of inter-token latencies in ms: (bin edges, counts); the range stops short of rare outliers."""
    ms = np.asarray(latencies_s, dtype=float) * 1000.0
    if not ms.size:
        return np.array([0.0, 1.0]), np.zeros(1)
    top = float(np.percentile(ms, 99.5)) * 1.1 or 1.0
    counts, edges = np.histogram(np.minimum(ms, top), bins=bins, range=(0.0, top))
    return edges, counts.astype(float)


def kv_waste(page_map: PageMap | None) -> tuple[int, int]:
    """(token slots allocated but unfilled, slots allocated) over pages held by requests: the tails of last pages."""
    if page_map is None:
        return 0, 0
    held = [fill for owners, fill in zip(page_map.owners, page_map.filled, strict=True) if owners]
    allocated = len(held) * page_map.page_size
    return allocated - sum(held), allocated


@dataclass(frozen=True)
class Summary:
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    output_tokens_per_s: float | None  # whole engine, over the window's busy steps
    stream_tokens_per_s: float | None  # one stream's decode speed: 1 / median inter-token latency
    prefix_hit_rate: float | None
    kv_waste_slots: int
    kv_allocated_slots: int
    preemptions: int
    pages_used: int
    pages_total: int
    weight_bytes: int
    kv_pool_bytes: int
    prefill_stall_max_s: float | None = None  # the longest a step's prefill made the streaming chats wait
    prefill_stall_total_s: float = 0.0

    @property
    def kv_waste_fraction(self) -> float | None:
        return self.kv_waste_slots / self.kv_allocated_slots if self.kv_allocated_slots else None

    @property
    def kv_used_bytes(self) -> int:
        return self.kv_pool_bytes * self.pages_used // self.pages_total if self.pages_total else 0


def summarize(view: WindowView, memory: MemoryInfo | None = None) -> Summary:
    memory = memory or MemoryInfo()
    tok, steps = view.tokens, view.steps
    first = tok["index"] == 0
    ttft, itl = tok["latency_s"][first], tok["latency_s"][~first]
    # the engine records only steps that ran something: idle gaps between chats don't dilute the rate
    busy_s = float(steps["duration_s"].sum())
    itl_p50 = percentile(itl, 50)
    queried = float(steps["prefix_query_tokens"].sum())
    waste, allocated = kv_waste(view.page_map)
    # the pool as it is now, of the engine read now (not the last step of an experiment's engine before it)
    pages_used, pages_total = view.pages_now or (0, memory.kv_pages)
    stalls = steps["prefill_stall_s"][steps["prefill_stall_s"] > 0]
    return Summary(
        ttft_p50_s=percentile(ttft, 50),
        ttft_p99_s=percentile(ttft, 99),
        itl_p50_s=itl_p50,
        itl_p99_s=percentile(itl, 99),
        output_tokens_per_s=view.num_tokens / busy_s if busy_s > 0 and view.num_tokens else None,
        stream_tokens_per_s=1.0 / itl_p50 if itl_p50 else None,
        prefix_hit_rate=float(steps["prefix_hit_tokens"].sum()) / queried if queried else None,
        kv_waste_slots=waste,
        kv_allocated_slots=allocated,
        preemptions=int(steps["preemptions"].sum()),
        pages_used=pages_used,
        pages_total=pages_total,
        weight_bytes=memory.weight_bytes,
        kv_pool_bytes=memory.kv_pool_bytes,
        prefill_stall_max_s=float(stalls.max()) if stalls.size else None,
        prefill_stall_total_s=float(stalls.sum()),
    )
