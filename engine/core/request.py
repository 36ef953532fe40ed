"""The state of one request as it moves through the engine: ids, status, page table, timestamps."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from engine.core.grammar import Matcher
from engine.types import FinishReason, RequestStats, SamplingParams


class RequestStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    tag: str = ""  # who asked (a chat tab's title, "api", ...), shown in the page map
    arrival_time: float = field(default_factory=time.monotonic)

    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    page_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V sit in the page pool
    cached_prompt_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    preemptions: int = 0
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    generator: torch.Generator | None = None
    admitted_once: bool = False
    matcher: Matcher | None = None  # where the output is in its grammar, for structured output

    def __post_init__(self) -> None:
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def remaining_to_compute(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def decoding(self) -> bool:
        """Its next chunk is a decode row: the one token sampled last step (see ScheduledChunk.is_decode)."""
        return self.remaining_to_compute == 1

    def stats(self) -> RequestStats:
        end = self.finish_time or time.monotonic()
        ttft = self.token_times[0] - self.arrival_time if self.token_times else None
        decode_rate = None
        if len(self.token_times) > 1:
            span = self.token_times[-1] - self.token_times[0]
            decode_rate = (len(self.token_times) - 1) / span if span > 0 else None
        return RequestStats(
            prompt_tokens=len(self.prompt_ids),
            cached_prompt_tokens=self.cached_prompt_tokens,
            output_tokens=len(self.output_ids),
            ttft_s=ttft,
            decode_tokens_per_s=decode_rate,
            e2e_s=end - self.arrival_time,
            queue_s=(self.first_scheduled_time - self.arrival_time) if self.first_scheduled_time else None,
            preemptions=self.preemptions,
            finish_reason=self.finish_reason or FinishReason.ABORT,
            inter_token_s=[b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)],
        )
