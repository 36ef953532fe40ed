"""Torch-free request and event types: what callers, remote clients and widgets import."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from engine.errors import InvalidRequestError

_ids = itertools.count(1)
#: seeds a torch generator takes: 64 bits, signed or not
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def new_request_id() -> str:
    return f"req-{next(_ids)}"


class FinishReason(StrEnum):
    """Why a request ended. A StrEnum, so it is also its own wire value ("stop", ...)."""

    STOP = "stop"  # EOS, stop token or stop string
    LENGTH = "length"  # max tokens or the model's context
    ABORT = "abort"  # cancelled by the client
    ERROR = "error"  # the step it was in failed

    @property
    def completed(self) -> bool:
        """The reply ended as the model or its limits decided (not cancelled, not failed)."""
        return self in (FinishReason.STOP, FinishReason.LENGTH)


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
    min_tokens: int = 0  # EOS and stop tokens cannot end the reply before it has this many tokens

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
        if self.seed is not None and not (isinstance(self.seed, int) and SEED_MIN <= self.seed <= SEED_MAX):
            bad(f"the seed must be an integer from {SEED_MIN} to {SEED_MAX}, not {self.seed}")
        if any(not s for s in self.stop):
            bad("stop strings must not be empty")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            bad(f"min tokens must be between 0 and max tokens ({self.max_tokens}), not {self.min_tokens}")


@dataclass
class RequestStats:
    """Final figures of a request, stamped where it ran; intervals computed at the edge."""

    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    ttft_s: float | None
    decode_tokens_per_s: float | None
    e2e_s: float
    queue_s: float | None
    preemptions: int
    finish_reason: FinishReason
    inter_token_s: list[float] = field(default_factory=list)


@dataclass
class TokenEvent:
    """What one step did for one request: new tokens and text, and the end when it came."""

    request_id: str
    tag: str
    token_ids: list[int]
    text: str
    time: float
    finished: bool = False
    finish_reason: FinishReason | None = None
    stats: RequestStats | None = None
    error: str | None = None


EventListener = Callable[[list[TokenEvent]], None]

ROLES = {"system", "user", "assistant", "tool", "developer"}


def validate_messages(messages: Sequence[dict]) -> list[dict]:
    """Chat messages checked and reduced to {role, content} with text content."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of {role, content} objects")
    clean = []
    for number, message in enumerate(messages, 1):
        if not isinstance(message, dict) or "role" not in message:
            raise InvalidRequestError(f"message {number} needs a 'role' and a 'content'")
        role = message["role"]
        content = message.get("content")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequestError(f"message {number} has unknown role {role!r}")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            content = "".join(texts) if all(isinstance(t, str) for t in texts) else None
        if not isinstance(content, str):
            raise InvalidRequestError(f"message {number} has no text content")
        clean.append({"role": role, "content": content})
    return clean
