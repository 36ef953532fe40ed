"""StepPlan: what the model layer runs in one step, as plain frozen data (the engine builds it from its scheduler)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.types import SamplingParams


class TokenMask(Protocol):
    """Where a request's grammar is: the tokens it allows next (engine.core.grammar's Matcher)."""

    def allowed(self) -> torch.Tensor: ...


@dataclass(frozen=True)
class SamplingRow:
    """One request that samples this step: what the sampler and the LM head read of it. It owns 1 + len(draft)
    rows of the step's logits (the row after its last known token, then one after each draft token)."""

    params: SamplingParams
    made: int  # tokens the reply has before this step (min_tokens, the seeded draws' positions)
    draft: tuple[int, ...] = ()  # speculative tokens verified this step
    matcher: TokenMask | None = None
    #: the tokens a repetition penalty reads (prompt and reply); filled only when the request has one
    seen: tuple[int, ...] = ()
    #: the reply's tokens, which presence and frequency penalties count; filled only when the request has one
    output: tuple[int, ...] = ()

    @property
    def rows(self) -> int:
        return 1 + len(self.draft)


@dataclass(frozen=True)
class ChunkPlan:
    """One sequence's tokens of the step: their ids (a verified draft's included), the position of the first, the
    pages that hold positions 0 to the last, and, when the chunk reaches the last known token, its sampling row."""

    tokens: tuple[int, ...]
    start: int
    pages: tuple[int, ...]
    sampling: SamplingRow | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def is_decode(self) -> bool:
        """A decode row: one query token. Decode rows share one batched attention call over their pages."""
        return len(self.tokens) == 1

    @property
    def draft(self) -> tuple[int, ...]:
        return self.sampling.draft if self.sampling is not None else ()


@dataclass(frozen=True)
class StepPlan:
    """The step's chunks in the order the model runs them: decode rows first (they share one attention call), then
    the rest. Sampled logits come back in this order, one group of rows per chunk that samples."""

    chunks: tuple[ChunkPlan, ...]

    def __post_init__(self) -> None:
        decodes = sum(1 for c in self.chunks if c.is_decode)
        if not all(c.is_decode for c in self.chunks[:decodes]):
            raise ValueError("a step plan lists its decode rows first")

    @property
    def sampling(self) -> list[SamplingRow]:
        return [c.sampling for c in self.chunks if c.sampling is not None]


def token_slice(parts: Sequence[Sequence[int]], start: int, count: int) -> tuple[int, ...]:
    """Tokens start to start + count of the parts laid end to end (a prompt, its reply, a draft), without joining
    them: a step reads a chunk's own tokens, never a copy of the whole sequence."""
    out: list[int] = []
    offset = 0
    end = start + count
    for part in parts:
        lo, hi = max(start - offset, 0), min(end - offset, len(part))
        if lo < hi:
            out.extend(part[lo:hi])
        offset += len(part)
        if offset >= end:
            break
    return tuple(out)
