"""The packed batch of one step: every scheduled token in one row, with positions, slots and attention metadata."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.model.attention import PagedKVCache, PrefillSlice, StepContext
from engine.model.lm_head import CANDIDATES, MAX_TOP_K, TOP_K_MARGIN
from engine.model.sampler import penalized_ids
from engine.model.step_plan import ChunkPlan, SamplingRow, StepPlan

# The compiled step's chunk table columns (decode_step.cpp's CHUNK_COLUMN_NAMES, checked when its library loads)
CHUNK_COLUMNS = ("first_row", "rows", "start")


@dataclass
class ChunkTables:
    """The step's sequences as the compiled step reads them: per chunk its CHUNK_COLUMNS (first row in the step,
    rows, first position), and its page table padded with its first page."""

    chunks: torch.Tensor  # [c, len(CHUNK_COLUMNS)] int64
    pages: torch.Tensor  # [c, max_pages] int64


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    keep: torch.Tensor  # rows whose logits are sampled: one per sampling chunk, 1 + draft for a verified draft
    context: StepContext
    sampling: list[SamplingRow]  # the chunks that sample, in the order of their rows in keep
    #: every sampled row picks among its likeliest tokens (greedy, or top-k sampling without bias or logprobs): how
    #: many leading candidates per row the LM head must compute exactly (model/lm_head.py); None: every logit
    leading: int | None = None
    #: per sampled row, tokens whose logits a repetition penalty changes (the LM head computes them exactly too)
    penalized: list[list[int]] | None = None
    tables: ChunkTables | None = None


def _flat_tokens(ordered: Sequence[ChunkPlan], page_size: int) -> tuple[list[int], list[int], list[int]]:
    """Token ids, positions and cache slots of every scheduled token, chunk after chunk."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    for chunk in ordered:
        input_ids.extend(chunk.tokens)
        table = chunk.pages
        for pos in range(chunk.start, chunk.start + chunk.num_tokens):
            positions.append(pos)
            slots.append(table[pos // page_size] * page_size + pos % page_size)
    return input_ids, positions, slots


def _decode_pages(decodes: Sequence[ChunkPlan], page_size: int, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Every decode row's pages, padded to the longest (padding repeats a page and is masked out), and lengths."""
    lens = [c.start + 1 for c in decodes]
    max_pages = math.ceil(max(lens) / page_size)
    flat: list[int] = []
    for chunk, length in zip(decodes, lens, strict=True):
        pages = chunk.pages[: math.ceil(length / page_size)]
        flat.extend(pages)
        flat.extend([pages[0]] * (max_pages - len(pages)))
    index = torch.tensor(flat, dtype=torch.long, device=device)
    return index, torch.tensor(lens, dtype=torch.long, device=device), max_pages


def _prefill_slices(prefills: Sequence[ChunkPlan], first_row: int, page_size: int, device) -> list[PrefillSlice]:
    slices: list[PrefillSlice] = []
    row = first_row
    for chunk in prefills:
        context = chunk.start + chunk.num_tokens
        page_index = None
        if chunk.start:  # earlier tokens sit in the cache: gather them
            pages = chunk.pages[: math.ceil(context / page_size)]
            page_index = torch.tensor(pages, dtype=torch.long, device=device)
        slices.append(PrefillSlice(row, chunk.num_tokens, context, page_index))
        row += chunk.num_tokens
    return slices


def _chunk_tables(ordered: Sequence[ChunkPlan], page_size: int, device) -> ChunkTables:
    rows: list[list[int]] = []
    tables: list[list[int]] = []
    row = 0
    for chunk in ordered:
        columns = {"first_row": row, "rows": chunk.num_tokens, "start": chunk.start}
        rows.append([columns[name] for name in CHUNK_COLUMNS])
        tables.append(list(chunk.pages[: math.ceil((chunk.start + chunk.num_tokens) / page_size)]))
        row += chunk.num_tokens
    width = max(len(t) for t in tables)
    padded = [t + [t[0]] * (width - len(t)) for t in tables]
    return ChunkTables(
        torch.tensor(rows, dtype=torch.long, device=device), torch.tensor(padded, dtype=torch.long, device=device)
    )


def pack(plan: StepPlan, cache: PagedKVCache, tables: bool = False) -> PackedBatch:
    """The plan's chunks in its order (decode rows first: they share one batched attention call). tables: the
    compiled step will run this batch (it reads ChunkTables; nothing else does, so other steps don't build them)."""
    ps, device = cache.page_size, cache.storage.device
    ordered = plan.chunks
    decodes = [c for c in ordered if c.is_decode]
    prefills = ordered[len(decodes) :]
    input_ids, positions, slots = _flat_tokens(ordered, ps)
    decode_index = decode_lens = None
    max_pages = 0
    if decodes:
        decode_index, decode_lens, max_pages = _decode_pages(decodes, ps, device)
    keep: list[int] = []
    row = 0
    for chunk in ordered:
        row += chunk.num_tokens
        if chunk.draft:  # every row of a verified draft is sampled: the last known token's and each draft token's
            keep.extend(range(row - chunk.num_tokens, row))
        elif chunk.sampling is not None:
            keep.append(row - 1)
    context = StepContext(
        cache=cache,
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        num_decode=len(decodes),
        decode_page_index=decode_index,
        decode_context_lens=decode_lens,
        decode_max_pages=max_pages,
        prefills=_prefill_slices(prefills, len(decodes), ps, device),
    )
    sampling = plan.sampling
    leading = _leading(sampling)
    return PackedBatch(
        leading=leading,
        penalized=_penalized(sampling) if leading is not None else None,  # only the leading path reads them
        input_ids=torch.tensor(input_ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        keep=torch.tensor(keep, dtype=torch.long, device=device),
        context=context,
        sampling=sampling,
        tables=_chunk_tables(ordered, ps, device) if tables and ordered else None,
    )


def _leading(sampling: Sequence[SamplingRow]) -> int | None:
    """The exact candidates every sampled row needs, or None when some row needs every logit: a logit bias (it may
    lift any token), logprobs (reported for the whole vocabulary), or sampling beyond a few hundred tokens. A grammar's
    mask and a ban of end tokens only remove candidates, and penalties are handled by _penalized."""
    counts = []
    for row in sampling:
        params = row.params
        if params.logit_bias or params.logprobs is not None:
            return None
        if params.greedy:  # a penalty lowers some leaders: more candidates, so the penalised pick is still exact
            counts.append(CANDIDATES + TOP_K_MARGIN if params.penalized else CANDIDATES)
        elif 0 < params.top_k <= MAX_TOP_K:
            counts.append(params.top_k + TOP_K_MARGIN)
        else:
            return None
    return max(counts) if counts else None


def _penalized(sampling: Sequence[SamplingRow]) -> list[list[int]] | None:
    """Per sampled row (1 + draft rows per chunk), the tokens its penalties change (repetition, presence, frequency);
    None if no row has one."""
    if not any(row.params.penalized for row in sampling):
        return None
    rows = []
    for row in sampling:
        rows.extend([penalized_ids(row)] * row.rows)
    return rows


def allowed_masks(sampling: Sequence[SamplingRow], vocab: int, end_ids: set[int]) -> torch.Tensor | None:
    """The tokens each sampled row may take [rows, vocab] (rows: a chunk's one, or 1 + its draft's): its grammar's
    mask, without the end tokens (`end_ids` and its stop_token_ids) while it has made fewer than min_tokens (what the
    sampler bans too: banned here, the LM head picks its leaders among the others). None when no row is limited."""
    if not any(s.matcher is not None or s.made < s.params.min_tokens for s in sampling):
        return None
    rows = []
    for sampled in sampling:
        matcher, params, made = sampled.matcher, sampled.params, sampled.made
        banned = frozenset(t for t in end_ids | set(params.stop_token_ids) if 0 <= t < vocab)
        mask = matcher.allowed() if matcher is not None else None
        for j in range(sampled.rows):
            if made + j < params.min_tokens and banned:
                if mask is None:
                    rows.append(_all_but(vocab, banned))
                else:
                    row = mask.clone()
                    row[list(banned)] = False
                    rows.append(row)
            else:
                rows.append(_all_but(vocab, frozenset()) if mask is None else mask)
    return torch.stack(rows)


@functools.lru_cache(maxsize=32)
def _all_but(vocab: int, banned: frozenset[int]) -> torch.Tensor:
    """Every token but `banned` (read only, shared): built once, since filling a vocab-wide mask each step cost
    ~3 % of a one-chat min_tokens step (a fill that size wakes torch's thread pool)."""
    mask = torch.ones(vocab, dtype=torch.bool)
    mask[list(banned)] = False
    return mask
