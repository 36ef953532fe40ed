"""SamplingParams and the state of one request as it moves through the engine."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from engine.errors import InvalidRequestError

_ids = itertools.count(1)


def new_request_id() -> str:
    return f"req-{next(_ids)}"


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        def bad(message: str) -> None:
            raise InvalidRequestError(message)

        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad(f"max tokens must be at least 1, not {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            bad(f"temperature must be 0 (greedy) or positive, not {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            bad(f"top-p must be in (0, 1], not {self.top_p}")
        if self.top_k < 0:
            bad(f"top-k must be 0 (off) or positive, not {self.top_k}")
        if not (0.0 <= self.min_p < 1.0):
            bad(f"min-p must be in [0, 1), not {self.min_p}")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            bad(f"repetition penalty must be positive, not {self.repetition_penalty}")
        if any(not s for s in self.stop):
            bad("stop strings must not be empty")


class RequestStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(StrEnum):
    STOP = "stop"  # EOS, stop token or stop string
    LENGTH = "length"  # max tokens or the model's context
    ABORT = "abort"  # cancelled by the client
    ERROR = "error"  # the step it was in failed


@dataclass
class RequestStats:
    """Final figures of a request, stamped in the engine; intervals computed here, at the edge."""

    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    ttft_s: float | None
    decode_tokens_per_s: float | None
    e2e_s: float
    queue_s: float | None
    preemptions: int
    finish_reason: str
    inter_token_s: list[float] = field(default_factory=list)


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
    num_registered_pages: int = 0  # leading full pages already hashed into the prefix cache
    cached_prompt_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    preemptions: int = 0
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    generator: torch.Generator | None = None
    admitted_once: bool = False

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
            finish_reason=(self.finish_reason or FinishReason.ABORT).value,
            inter_token_s=[b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)],
        )
