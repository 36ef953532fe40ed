"""Engine: add_request, abort, step() -> token events; a step is schedule, run (forward + sample), postprocess."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from engine.core.config import EngineConfig, step_tokens_for
from engine.core.drafter import Drafter
from engine.core.grammar import Grammars, Matcher
from engine.core.metrics import MetricsRecorder, PageMap, StepRecord
from engine.core.outputs import OutputProcessor
from engine.core.page_pool import PagePool
from engine.core.prompts import encode_prompt, eos_token_ids
from engine.core.request import Request
from engine.core.runtime import runtime_record
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.step_cost import StepCostModel
from engine.core.step_planner import plan_step
from engine.errors import InvalidRequestError, PromptTooLongError, UnsupportedOptionError
from engine.load import kv_policy
from engine.load.loader import LoadedModel
from engine.load.memory import free_memory_bytes, release_freed_memory
from engine.model import check_memory, formats
from engine.model.attention import PagedKVCache
from engine.model.geometry import attention_geometry
from engine.model.runner import ModelRunner, output_size
from engine.model.sampler import Sampler, token_logprobs
from engine.types import FinishReason, SamplingParams, TokenEvent, TokenLogprob, new_request_id

log = logging.getLogger(__name__)

PAGE_MAP_INTERVAL_S = 0.1  # the dashboard reads at about 10 Hz


@dataclass
class StepRun:
    """What the model did in one step: the requests that sampled, the tokens each gained (several where a draft
    was accepted), or why it failed."""

    sampled: list[Request]
    tokens: list[list[int]]
    forward_s: float = 0.0
    weight_format: str = ""
    draft_tokens: int = 0
    accepted_tokens: int = 0
    error: str | None = None
    logprobs: list[list[TokenLogprob] | None] | None = None


def weight_formats(loaded: LoadedModel) -> tuple[str, ...]:
    """Formats the lean forward may use beside the model's own, the fastest per batch size measured at load: on a
    CPU, bfloat16 copies of a float32 model when the user left the dtype to the studio (an explicit dtype is
    honoured: token-exact checks pin float32). A model held as stored (or quantized by the loader) runs its own, and,
    under an automatic dtype, a bfloat16 (float32 without bfloat16 kernels) copy for the batch sizes it is measured
    faster at, where that copy is small and fits (the lean forward decides: fast_forward.COPY_MAX_BYTES)."""
    options = loaded.options
    device = torch.device(options.device)
    if loaded.as_stored:
        if options.engine_quantized and not formats.usable(options.quantization, device):
            raise UnsupportedOptionError(
                f"{options.quantization} needs torch's weight-only CPU kernel, which this torch build lacks; "
                "choose bfloat16, or nf4 (bitsandbytes)"
            )
        if device.type != "cpu" or not options.dtype_auto or options.quantization != "none":
            return ()
        return (formats.BFLOAT16,) if formats.usable(formats.BFLOAT16, device) else (formats.FLOAT32,)
    if options.dtype != torch.float32 or not options.dtype_auto:
        return ()
    usable = [fmt for fmt in (formats.BFLOAT16,) if formats.usable(fmt, device)]
    return (formats.FLOAT32, *usable) if usable else ()


class Engine:
    def __init__(
        self, loaded: LoadedModel, config: EngineConfig | None = None, progress: Callable[[str], None] | None = None
    ) -> None:
        """progress: told what is measured and checked while the engine is built (the window's status bar)."""
        config = config or EngineConfig()
        if config.max_step_tokens is None:
            config = replace(config, max_step_tokens=step_tokens_for(str(loaded.options.device)))
        config.validate()
        self.config = config
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer

        geometry = attention_geometry(self.model.config)
        kv_dtype = loaded.kv_dtype
        self.kv_bytes_per_token = geometry.kv_bytes_per_token(torch.empty((), dtype=kv_dtype).element_size())
        auto = None
        if config.kv_memory_bytes is None and config.kv_pages is None:  # sized here, with the model loaded
            auto = kv_policy.default_budget(self.kv_bytes_per_token, free_memory_bytes(str(loaded.options.device)))
        num_pages = config.pages_for(self.kv_bytes_per_token, auto)
        ps = config.page_size
        self.cache = PagedKVCache(
            geometry.num_layers, geometry.num_kv_heads, geometry.head_dim, num_pages, ps, kv_dtype,
            loaded.options.device,
        )  # fmt: skip
        identity = check_memory.weights_identity(loaded.source.path, loaded.options)
        self.runner = ModelRunner(
            self.model, self.cache, config.optimize, weight_formats(loaded), config.compiled_step, progress, identity
        )
        release_freed_memory()  # the copies the format measurement built and dropped: back to the OS, not the heap
        self.kernels = self.runner.kernels
        self.step_cost = StepCostModel(
            config.prefill_budget_s or 0.0, config.prefill_stall_ratio, min_tokens=ps, max_tokens=config.max_step_tokens
        )
        self.metrics = MetricsRecorder(config.metrics_capacity)
        self.vocab_size = output_size(self.model)
        text_config = self.model.config.get_text_config()
        self.context_length = getattr(text_config, "max_position_embeddings", None) or num_pages * ps
        eos_ids = eos_token_ids(self.tokenizer, self.model)
        self.sampler = Sampler(eos_ids=eos_ids)
        self.runner.end_token_ids = set(eos_ids)
        self.grammars = Grammars(self.tokenizer, self.vocab_size, eos_ids, close_objects=not config.open_schema_objects)
        self._build_bookkeeping(num_pages, eos_ids)
        self.step_count = 0
        self._last_page_map = 0.0
        #: tests set this to make a step fail; called with the scheduled work before the forward pass
        self.fault_injector: Callable[[SchedulerOutput], None] | None = None

    def _build_bookkeeping(self, num_pages: int, eos_ids: set[int]) -> None:
        """The page pool, the queues and the live requests: everything a failure can leave inconsistent."""
        config = self.config
        self.pool = PagePool(num_pages, config.page_size, config.prefix_caching)
        tokens_for = self.step_cost.prefill_token_budget if config.prefill_budget_s is not None else None
        drafter = Drafter(config.draft_max) if config.speculative and config.draft_max else None
        self.scheduler = Scheduler(config, self.pool, prefill_tokens_for=tokens_for, drafter=drafter)
        self.outputs = OutputProcessor(self.tokenizer, eos_ids, self.context_length, self.scheduler, self.metrics)
        self.requests: dict[str, Request] = {}

    def reset_requests(self) -> list[str]:
        """Forget every request and start the pool afresh (no cached prefixes); the ids dropped are returned. For
        when finishing requests failed and the pool's counts can no longer be trusted. Engine thread only."""
        dropped = list(self.requests)
        log.warning("resetting the engine's requests and KV pages (%d requests dropped)", len(dropped))
        self._build_bookkeeping(self.pool.num_pages, self.outputs.eos_ids)
        self._publish_page_map(force=True)
        return dropped

    @property
    def eos_ids(self) -> set[int]:
        """Tokens that end a reply (unless a request ignores EOS)."""
        return self.outputs.eos_ids

    @eos_ids.setter
    def eos_ids(self, ids: set[int]) -> None:
        self.outputs.eos_ids = ids
        self.sampler.eos_ids = set(ids)
        self.runner.end_token_ids = set(ids)

    # ---- requests ---------------------------------------------------------------------------
    @property
    def pool_tokens(self) -> int:
        return self.pool.num_pages * self.pool.page_size

    def encode(
        self,
        prompt: str | None = None,
        messages: Sequence[dict] | None = None,
        raw: bool = False,
        tools: Sequence[dict] | None = None,
    ) -> list[int]:
        return encode_prompt(self.tokenizer, prompt=prompt, messages=messages, raw=raw, tools=tools)

    def check_request(self, prompt_ids: Sequence[int], params: SamplingParams, *, grammar: bool = True) -> None:
        """Refuse what can never run, with a message for the user. Safe to call from any thread. grammar=False: the
        caller has the request's matcher already (its grammar was checked when it was made)."""
        params.validate()
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        if any(not 0 <= t < self.vocab_size for t in prompt_ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {self.vocab_size})")
        if len(prompt_ids) >= self.context_length:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens but the model's context is {self.context_length}; shorten it"
            )
        if any(not 0 <= t < self.vocab_size for t, _ in params.logit_bias):
            raise InvalidRequestError(f"logit bias token ids must be in [0, {self.vocab_size})", param="logit_bias")
        if params.structured is not None and grammar:
            self.grammars.check(params.structured)  # compiled (and cached) now: a bad schema is the caller's error
        if len(prompt_ids) + 1 > self.pool_tokens:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens but the KV cache holds only {self.pool_tokens}; "
                "shorten it or give the KV cache more memory"
            )

    def add_request(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        tag: str = "",
        arrival_time: float | None = None,
        matcher: Matcher | None = None,
        checked: bool = False,
    ) -> Request:
        """matcher: the request's grammar matcher, made by the caller (EngineThread.submit makes it in the caller's
        thread, so a grammar evicted from the cache meanwhile is never compiled in the engine's). checked: the caller
        ran check_request on these ids and params (EngineThread.submit does, in the caller's thread)."""
        params = params or SamplingParams()
        if not checked:
            self.check_request(prompt_ids, params, grammar=matcher is None)
        request = Request(request_id or new_request_id(), list(prompt_ids), params, tag=tag)
        if arrival_time is not None:
            request.arrival_time = arrival_time
        if params.structured is not None:
            request.matcher = matcher or self.grammars.matcher(params.structured)
        if request.request_id in self.requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.outputs.add(request)
        self.scheduler.add(request)
        return request

    def abort(self, request_id: str) -> TokenEvent | None:
        """Cancel a request; its pages return to the pool at once. Unknown or finished ids are ignored."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return None
        event = self.finish(request, FinishReason.ABORT, time.monotonic())
        self._publish_page_map(force=True)
        return event

    def finish(self, request: Request, reason: FinishReason, now: float, error: str | None = None) -> TokenEvent:
        """End a request for a reason of the caller's (cancelled, failed): pages freed, final event returned."""
        event = self.outputs.finish(request, reason, now, error=error)
        # only once finished: a request whose finishing failed stays known, so fail_all() still answers it
        self.requests.pop(request.request_id, None)
        return event

    def fail_all(self, message: str) -> list[TokenEvent]:
        """End every request with an error (the engine cannot go on with them). Never raises: a request that cannot
        be finished cleanly (its pages will not go back) still gets its error event, and the pool starts afresh."""
        now = time.monotonic()
        events, broken = [], False
        for request in list(self.requests.values()):
            try:
                events.append(self.finish(request, FinishReason.ERROR, now, error=message))
            except Exception:
                log.exception("finishing request %s after a failure failed too", request.request_id)
                broken = True
                self.requests.pop(request.request_id, None)
                events.append(TokenEvent.failed(request.request_id, message, tag=request.tag, at=now))
        if broken:
            self.reset_requests()
        return events

    def _token_text(self, token_id: int) -> str:
        """A token as text on its own (byte pieces of a longer character show as the replacement character)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- the step ---------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        started = time.monotonic()
        scheduled = self.scheduler.schedule()
        events = [self.finish(r, FinishReason.LENGTH, started) for r in scheduled.out_of_pages]
        if not scheduled.chunks:
            if events:  # their pages went back with no step to record: say so now, or the page map stays full
                self._publish_page_map(force=True)
            return events
        for request in scheduled.admitted:
            request.first_scheduled_time = request.first_scheduled_time or started
        run = self._run(scheduled)
        events += self._postprocess(scheduled, run)
        self._record_step(scheduled, started, run, events)
        return events

    def _run(self, scheduled: SchedulerOutput) -> StepRun:
        """The forward pass over the scheduled chunks, then sampling. A failure fails this step's requests only."""
        try:
            if self.fault_injector is not None:
                self.fault_injector(scheduled)
            plan, ordered = plan_step(scheduled.chunks, self.pool.page_size)
            result = self.runner.execute(plan)
            chunks = [c for c in ordered if c.samples]  # in the order of the plan's sampling rows
            sampled = [c.request for c in chunks]
            rows = plan.sampling
            tokens = self.sampler.sample(result.logits, rows, result.grammar_applied) if rows else []
            logprobs = None
            if any(r.params.logprobs is not None for r in rows):
                logprobs = token_logprobs(result.logits, rows, tokens, self._token_text)
            accepted = {id(c): len(t) - 1 for c, t in zip(chunks, tokens, strict=True) if c.draft}
            for chunk in scheduled.chunks:
                self.scheduler.commit(chunk, accepted.get(id(chunk), 0))
            drafted = sum(len(c.draft) for c in chunks)
            run = StepRun(sampled, tokens, result.forward_s, result.weight_format, drafted, sum(accepted.values()))
            run.logprobs = logprobs
            return run
        except Exception as exc:
            log.exception("engine step %d failed", self.step_count)
            return StepRun([], [], error=f"the engine failed while running this request: {type(exc).__name__}: {exc}")

    def _postprocess(self, scheduled: SchedulerOutput, run: StepRun) -> list[TokenEvent]:
        now = time.monotonic()
        if run.error is not None:
            failed = [c.request for c in scheduled.chunks if not c.request.is_finished]
            return [self.finish(request, FinishReason.ERROR, now, error=run.error) for request in failed]
        events = self.outputs.process(run.sampled, run.tokens, now, run.logprobs)
        for event in events:
            if event.finished:
                self.requests.pop(event.request_id, None)
        return events

    # ---- metrics ----------------------------------------------------------------------------
    def _record_step(self, out: SchedulerOutput, started: float, run: StepRun, events: list[TokenEvent]) -> None:
        self.step_count += 1
        duration = time.monotonic() - started
        stall = self.step_cost.stall(out.decode_tokens, out.prefill_tokens, duration)
        self.step_cost.observe(out.decode_tokens, out.prefill_tokens, duration)
        self._publish_page_map(force=bool(out.admitted or out.preempted or any(e.finished for e in events)))
        pool = self.pool
        # shared pages are full prefix pages: every reference beyond the first counts them twice
        used_slots = sum(r.num_computed for r in self.scheduler.running) - pool.extra_refs * pool.page_size
        cached_free = pool.num_cached_free
        self.metrics.record_step(
            StepRecord(
                step=self.step_count,
                start=started,
                duration_s=duration,
                forward_s=run.forward_s,
                prefill_tokens=out.prefill_tokens,
                decode_tokens=out.decode_tokens,
                batch_size=len(out.chunks),
                running=len(self.scheduler.running),
                waiting=len(self.scheduler.waiting),
                pages_used=pool.num_used,
                pages_cached_free=cached_free,
                pages_free=pool.num_free - cached_free,
                pages_total=pool.num_pages,
                kv_slots_used=used_slots,
                preemptions=len(out.preempted),
                prefix_query_tokens=out.prefix_query_tokens,
                prefix_hit_tokens=out.prefix_hit_tokens,
                prefill_stall_s=stall,
                prefill_allowed=out.prefill_allowed,
                weight_format=run.weight_format,
                draft_tokens=run.draft_tokens,
                accepted_tokens=run.accepted_tokens,
                admitted=tuple(r.request_id for r in out.admitted),
                finished=tuple(e.request_id for e in events if e.finished),
                preempted=tuple(r.request_id for r in out.preempted),
            )
        )

    def page_map(self) -> PageMap:
        """Owners, fill and cache state of every page (engine thread only; cheap: views are built lazily)."""
        pool = self.pool
        running = self.scheduler.running
        tables = tuple((r.request_id, tuple(r.page_table), r.num_computed) for r in running)
        cached = frozenset(page for page in pool.cached.values())
        return PageMap(pool.page_size, pool.num_pages, tables, cached, {r.request_id: r.tag for r in running})

    def _publish_page_map(self, force: bool = False) -> PageMap | None:
        now = time.monotonic()
        if not force and now - self._last_page_map < PAGE_MAP_INTERVAL_S:
            return None
        self._last_page_map = now
        page_map = self.page_map()
        self.metrics.publish_page_map(page_map)
        return page_map

    def runtime_record(self) -> dict[str, object]:
        """What runs: formats, kernels, the fast path and its check, threads, budgets (engine/core/runtime.py)."""
        return runtime_record(self)

    def kv_pages_needed(self, tokens: int) -> int:
        return math.ceil(tokens / self.pool.page_size)
