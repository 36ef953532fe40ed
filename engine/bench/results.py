"""Per-request timings and per-system summaries (throughput, TTFT, inter-token and end-to-end percentiles)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestTiming:
    arrival: float  # perf_counter() at which the request was (or would have been) sent
    token_times: list[float]  # perf_counter() of every useful output token (or streamed chunk)
    tokens: int | None = None  # output tokens, where chunks and tokens differ (a server's stream; its usage)

    @property
    def output_tokens(self) -> int:
        return self.tokens if self.tokens is not None else len(self.token_times)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def inter_token(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def e2e(self) -> float:
        return self.token_times[-1] - self.arrival


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class SystemResult:
    system: str
    wall_s: float
    timings: list[RequestTiming]
    outputs: list[list[int]] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)  # the replies as text, where token ids are not seen
    skipped: str | None = None  # why the system did not run
    failed: str | None = None  # why it ran but gave no figures (its server died, would not start, ...)

    @property
    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.timings)

    def summary(self) -> dict:
        if self.skipped:
            return {"system": self.system, "skipped": self.skipped}
        if self.failed:
            return {"system": self.system, "failed": self.failed}
        ttft = [t.ttft for t in self.timings]
        itl = [x for t in self.timings for x in t.inter_token]
        e2e = [t.e2e for t in self.timings]
        return {
            "system": self.system,
            "wall_s": self.wall_s,
            "output_tokens": self.output_tokens,
            "tokens_per_s": self.output_tokens / self.wall_s if self.wall_s > 0 else None,
            "ttft_p50_s": percentile(ttft, 50),
            "ttft_p99_s": percentile(ttft, 99),
            "itl_p50_s": percentile(itl, 50),
            "itl_p99_s": percentile(itl, 99),
            "e2e_p50_s": percentile(e2e, 50),
            "e2e_p99_s": percentile(e2e, 99),
            **self.extra,
        }


def kv_waste(steps, page_size: int) -> float | None:
    """Allocated-but-unused KV slots divided by allocated slots, summed over every step of a run."""
    allocated = sum(s.pages_used for s in steps) * page_size
    if not allocated:
        return None
    return (allocated - sum(s.kv_slots_used for s in steps)) / allocated
