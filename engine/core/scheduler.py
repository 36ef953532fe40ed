"""Continuous batching: each step decodes every running request, then prefills waiting ones in chunks."""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.core.config import CPU_STEP_TOKENS, EngineConfig
from engine.core.drafter import Drafter
from engine.core.page_pool import PagePool
from engine.core.request import Request, RequestStatus
from engine.types import FinishReason


@dataclass
class ScheduledChunk:
    request: Request
    num_tokens: int  # tokens whose K/V this step computes
    start: int  # position of the first of them
    samples: bool  # the chunk reaches the last known token, so this step samples the next one
    draft: tuple[int, ...] = ()  # speculative tokens after the last known one, verified (and sampled at) this step

    @property
    def is_decode(self) -> bool:
        """A decode row: one query token. Decode rows share one batched attention call over their pages; every
        other chunk (a prompt, a recompute after preemption, a verified draft) goes through the chunked path."""
        return self.num_tokens == 1

    @property
    def decodes(self) -> bool:
        """Decoding work (a decode row or a verified draft), as opposed to prefilling a prompt."""
        return self.is_decode or bool(self.draft)


#: how far down the waiting queue a step looks for prompts short enough to go before long ones
LOOKAHEAD = 16


@dataclass
class _Budget:
    """What is left of a step: tokens in all, and of those, prefill tokens (the time budget's share)."""

    tokens: int
    prefill: int

    def prefill_limit(self) -> int:
        return min(self.tokens, self.prefill)

    def spend(self, n: int) -> None:
        self.tokens -= n
        self.prefill -= n


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    #: requests that cannot grow because they alone fill the pool: the engine ends them
    out_of_pages: list[Request] = field(default_factory=list)
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefill_allowed: int = 0  # prefill tokens this step was allowed beside its decode rows

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def decode_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if c.decodes)

    @property
    def prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if not c.decodes)

    @property
    def draft_tokens(self) -> int:
        return sum(len(c.draft) for c in self.chunks)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        pool: PagePool,
        prefill_tokens_for: Callable[[int], int] | None = None,
        drafter: Drafter | None = None,
    ) -> None:
        """prefill_tokens_for(decode rows) -> prefill tokens a step may add (the engine's step cost model turns its
        time budget into tokens); without it, the step token budget alone limits prefill. drafter: speculative drafts
        for decoding requests."""
        self.config = config
        self.pool = pool
        self.prefill_tokens_for = prefill_tokens_for
        self.drafter = drafter
        self.page_size = pool.page_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # keep a few pages back when admitting, so running requests can grow without preempting at once
        self.watermark = max(1, pool.num_pages // 100)

    # ---- queue management -------------------------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Take the request out of the queues and give its pages back at once."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            with contextlib.suppress(ValueError):
                self.waiting.remove(request)
        self._free_pages(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        if self.drafter is not None:
            self.drafter.forget(request.request_id)

    def _free_pages(self, request: Request) -> None:
        self.pool.release_request(request.request_id, request.page_table)
        request.page_table = []
        request.num_computed = 0

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: drop all of its K/V and requeue it at the front."""
        self.running.remove(request)
        self._free_pages(request)
        request.status = RequestStatus.WAITING
        request.preemptions += 1
        self.waiting.appendleft(request)

    # ---- the step ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        # an engine always resolves the budget for its device; a bare scheduler (tests) takes the CPU one
        step_tokens = self.config.max_step_tokens or CPU_STEP_TOKENS
        # Decodes first: one token each, so a long prefill never stalls the streams already running; prefill gets
        # what is left, within a budget that keeps the step short while streams wait on it.
        decoding = [r for r in self.running if r.decoding]
        prefilling = [r for r in self.running if not r.decoding]
        prefill = self.prefill_tokens_for(len(decoding)) if self.prefill_tokens_for else step_tokens
        out.prefill_allowed = prefill
        budget = _Budget(step_tokens, prefill)
        for request in decoding:
            if budget.tokens <= 0 or request.status is not RequestStatus.RUNNING:
                continue  # out of tokens, or preempted earlier in this loop
            n = min(request.remaining_to_compute, budget.tokens)
            if self._grow(request, request.num_computed + n, out):
                out.chunks.append(self._chunk(request, n))
                budget.tokens -= n
        # Prefill: prompts that finish within one step's tokens go first, then the long ones, so a new chat's question
        # arriving beside a prompt of thousands of tokens gets its first token a step or two later instead of waiting
        # for all of that prompt; the long prompts take what is left (the oldest at least a page a step, so it always
        # advances).
        slow = [r for r in prefilling if r.remaining_to_compute > step_tokens]
        for request in prefilling:
            if request not in slow:
                self._prefill(request, budget.prefill_limit(), budget, out)
        self._admit_waiting(budget, out, quick_within=step_tokens)
        for index, request in enumerate(slow):
            floor = self.page_size if index == 0 else 0  # the oldest long prompt advances every step
            self._prefill(request, min(budget.tokens, max(budget.prefill_limit(), floor)), budget, out)
        # Drafts once every running request has the pages for its own next tokens: a draft only uses pages that are
        # free then, and never preempts anyone (nor ends a lone request that still has room for its real tokens).
        if self.drafter is not None and len(decoding) <= self.config.speculative_max_batch:
            for index, chunk in enumerate(out.chunks):
                if budget.tokens > 0 and chunk.is_decode and chunk.samples:
                    draft = self._draft(chunk.request, budget.tokens)
                    if draft:
                        out.chunks[index] = self._chunk(chunk.request, 1, tuple(draft))
                        budget.tokens -= len(draft)
        self._admit_waiting(budget, out)
        return out

    def _prefill(self, request: Request, limit: int, budget: _Budget, out: SchedulerOutput) -> None:
        """The next chunk of a running request's prompt (or of its recompute after preemption), up to limit tokens."""
        if limit <= 0 or request.status is not RequestStatus.RUNNING:  # out of budget, or preempted meanwhile
            return
        n = min(request.remaining_to_compute, limit)
        if self._grow(request, request.num_computed + n, out):
            out.chunks.append(self._chunk(request, n))
            budget.spend(n)

    def _admit_waiting(self, budget: _Budget, out: SchedulerOutput, quick_within: int | None = None) -> None:
        """Admit waiting requests in arrival order while budget, pages and running slots last. quick_within: only
        those whose uncached prompt fits in that many tokens (looking LOOKAHEAD requests down the queue)."""
        candidates = list(self.waiting)[:LOOKAHEAD] if quick_within is not None else list(self.waiting)
        for request in candidates:
            if budget.prefill_limit() <= 0 or len(self.running) >= self.config.max_running:
                return
            chunk = self._admit(request, budget.prefill_limit(), out, quick_within)
            if chunk is None:
                if quick_within is None:
                    return  # out of pages: later requests wait behind this one
                continue
            self.waiting.remove(request)
            out.chunks.append(chunk)
            budget.spend(chunk.num_tokens)

    @staticmethod
    def _chunk(request: Request, n: int, draft: tuple[int, ...] = ()) -> ScheduledChunk:
        start = request.num_computed
        return ScheduledChunk(request, n + len(draft), start, start + n == request.num_tokens, draft)

    def _draft(self, request: Request, room: int) -> list[int]:
        """Draft tokens to verify with this request's decode, within the step's budget and its max tokens."""
        assert self.drafter is not None
        params = request.params
        if params.penalized or params.structured is not None:
            # a penalty depends on every token before it, a grammar's mask on its place: drafts stay off for these
            # (verified rows would need them applied position by position)
            return []
        left = params.max_tokens - len(request.output_ids) - 1  # the verified step adds one token beyond the drafts
        draft = self.drafter.propose(request.request_id, request.all_ids)
        draft = draft[: max(0, min(left, room, self._page_room(request)))]
        needed = math.ceil((request.num_computed + 1 + len(draft)) / self.page_size) - len(request.page_table)
        if needed > 0:
            request.page_table.extend(self.pool.allocate(needed))
        return draft

    def _page_room(self, request: Request) -> int:
        """Draft tokens that fit after the request's next token in the pages it holds and the free ones, keeping the
        watermark free while others run or wait (their own tokens come before anyone's drafts)."""
        held = len(request.page_table) * self.page_size - (request.num_computed + 1)
        reserve = self.watermark if len(self.running) > 1 or self.waiting else 0
        return held + max(0, self.pool.num_free - reserve) * self.page_size

    def _grow(self, request: Request, tokens: int, out: SchedulerOutput) -> bool:
        """Give the request pages for `tokens` tokens, preempting the newest running requests if needed."""
        needed = math.ceil(tokens / self.page_size) - len(request.page_table)
        while needed > self.pool.num_free:
            victim = self.running[-1]
            if victim is request and len(self.running) == 1:
                out.out_of_pages.append(request)
                return False
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                return False
        if needed > 0:
            request.page_table.extend(self.pool.allocate(needed))
        return True

    def _admit(
        self, request: Request, budget: int, out: SchedulerOutput, quick_within: int | None = None
    ) -> ScheduledChunk | None:
        ps = self.page_size
        tokens = request.all_ids
        if quick_within is not None:
            most_cached = (len(tokens) - 1) // ps * ps if self.pool.enable_caching else 0
            if len(tokens) - most_cached > quick_within:
                return None  # not quick even if all of it were cached: no need to hash it
        hit = self.pool.match_prefix(tokens)
        hit_tokens = hit.num_pages * ps
        if quick_within is not None and len(tokens) - hit_tokens > quick_within:
            return None
        reserve = self.watermark if self.running else 0
        available = self.pool.num_free - self.pool.num_free_among(hit.pages) - reserve
        n = min(len(tokens) - hit_tokens, budget)
        new_pages = math.ceil((hit_tokens + n) / ps) - hit.num_pages
        if new_pages > available:
            n = available * ps  # a shorter first chunk; the rest follows in later steps
            new_pages = available
            if n <= 0:
                return None
        request.page_table = self.pool.admit(request.request_id, hit, new_pages)
        request.num_computed = hit_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        out.admitted.append(request)
        if not request.admitted_once:
            request.admitted_once = True
            request.cached_prompt_tokens = min(hit_tokens, len(request.prompt_ids))
            out.prefix_query_tokens += len(request.prompt_ids)
            out.prefix_hit_tokens += request.cached_prompt_tokens
        return self._chunk(request, n)

    # ---- after the forward pass -------------------------------------------------------------
    def commit(self, chunk: ScheduledChunk, accepted: int = 0) -> None:
        """The chunk's K/V are written: advance the request (past the draft tokens accepted, not the rejected ones,
        whose slots later tokens overwrite) and publish its newly full pages."""
        request = chunk.request
        request.num_computed += chunk.num_tokens - len(chunk.draft) + accepted
        if chunk.draft and self.drafter is not None:
            self.drafter.learn(request.request_id, len(chunk.draft), accepted)
        full_pages = request.num_computed // self.page_size
        if self.pool.enable_caching and full_pages > self.pool.num_published(request.request_id):
            # the accepted draft tokens are the request's next tokens, but they join output_ids only when the step's
            # tokens are processed: hash the pages they filled with them (a page hashed over fewer tokens would be
            # found by no one, and every later page of the request chains from its hash)
            tokens = request.all_ids + list(chunk.draft[:accepted]) if accepted else request.all_ids
            self.pool.publish(request.request_id, tokens, request.page_table, request.num_computed)
