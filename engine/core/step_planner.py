"""The scheduler's chunks as the model layer's StepPlan: each chunk's own tokens and pages, and what its sampling
reads of its request."""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.request import Request
from engine.core.scheduler import ScheduledChunk
from engine.model.step_plan import ChunkPlan, SamplingRow, StepPlan, token_slice


def plan_step(chunks: Sequence[ScheduledChunk], page_size: int) -> tuple[StepPlan, list[ScheduledChunk]]:
    """The plan, and the scheduled chunks in its order (decode rows first), which is the order of its sampled rows."""
    ordered = [c for c in chunks if c.is_decode] + [c for c in chunks if not c.is_decode]
    return StepPlan(tuple(plan_chunk(c, page_size) for c in ordered)), ordered


def plan_chunk(chunk: ScheduledChunk, page_size: int) -> ChunkPlan:
    request = chunk.request
    end = chunk.start + chunk.num_tokens
    tokens = token_slice((request.prompt_ids, request.output_ids, chunk.draft), chunk.start, chunk.num_tokens)
    pages = tuple(request.page_table[: -(-end // page_size)])
    return ChunkPlan(tokens, chunk.start, pages, sampling_row(request, chunk.draft) if chunk.samples else None)


def sampling_row(request: Request, draft: tuple[int, ...] = ()) -> SamplingRow:
    """What sampling reads of a request: the token history only where a penalty reads it (a copy per step)."""
    params = request.params
    seen = (*request.prompt_ids, *request.output_ids) if params.repetition_penalty != 1.0 else ()
    output = tuple(request.output_ids) if params.presence_penalty or params.frequency_penalty else ()
    return SamplingRow(params, len(request.output_ids), tuple(draft), request.matcher, seen, output)
