"""Engine: add_request, abort, step() -> token events; one step = schedule, run the model, sample, detokenize."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import torch

from engine import fast_forward, kernels
from engine.attention import PagedKVCache
from engine.config import EngineConfig, step_tokens_for
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import InvalidRequestError, PromptTooLongError
from engine.loader import LoadedModel
from engine.metrics import MetricsRecorder, PageMap, StepRecord, TokenRecord
from engine.page_pool import PagePool
from engine.prompts import encode_prompt, eos_token_ids
from engine.request import FinishReason, Request, RequestStats, SamplingParams, new_request_id
from engine.runner import ModelRunner, prepare_model
from engine.sampler import Sampler
from engine.scheduler import Scheduler, SchedulerOutput

log = logging.getLogger(__name__)

PAGE_MAP_INTERVAL_S = 0.1  # the dashboard reads at about 10 Hz


@dataclass
class TokenEvent:
    """What one step did for one request: new tokens and text, and the end when it came."""

    request_id: str
    tag: str
    token_ids: list[int]
    text: str
    time: float
    finished: bool = False
    finish_reason: str | None = None
    stats: RequestStats | None = None
    error: str | None = None


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None) -> None:
        config = config or EngineConfig()
        if config.max_step_tokens is None:
            config = replace(config, max_step_tokens=step_tokens_for(str(loaded.options.device)))
        self.config = config
        self.config.validate()
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        prepare_model(self.model)
        self.fast = fast_forward.build(self.model) if self.config.optimize else None
        if self.fast is not None:
            self.kernels = list(self.fast.kinds)
        elif self.config.optimize:  # other architectures: speed-ups patched into the transformers modules
            self.kernels = kernels.optimize(self.model).kinds
        else:
            self.kernels = []
        patches = getattr(self.model, kernels._ATTR, None)
        if patches is not None and (not self.kernels or self.fast is not None):
            patches.restore()

        text_config = self.model.config.get_text_config()
        heads = text_config.num_attention_heads
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
        kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
        layers = text_config.num_hidden_layers
        kv_dtype = loaded.options.dtype
        elem = torch.empty((), dtype=kv_dtype).element_size()
        self.kv_bytes_per_token = layers * 2 * kv_heads * head_dim * elem
        num_pages = self.config.pages_for(self.kv_bytes_per_token)
        ps = self.config.page_size
        device = loaded.options.device

        self.pool = PagePool(num_pages, ps, self.config.prefix_caching)
        self.cache = PagedKVCache(layers, kv_heads, head_dim, num_pages, ps, kv_dtype, device)
        self.scheduler = Scheduler(self.config, self.pool)
        self.runner = ModelRunner(self.model, self.cache, self.fast)
        self.sampler = Sampler()
        self.metrics = MetricsRecorder(self.config.metrics_capacity)
        self.eos_ids = eos_token_ids(self.tokenizer, self.model)
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]
        self.context_length = getattr(text_config, "max_position_embeddings", None) or num_pages * ps
        self.requests: dict[str, Request] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.step_count = 0
        self._last_page_map = 0.0
        #: tests set this to make a step fail; called with the scheduled work before the forward pass
        self.fault_injector: Callable[[SchedulerOutput], None] | None = None

    # ---- requests ---------------------------------------------------------------------------
    @property
    def pool_tokens(self) -> int:
        return self.pool.num_pages * self.pool.page_size

    def encode(self, prompt: str | None = None, messages: Sequence[dict] | None = None, raw: bool = False) -> list[int]:
        return encode_prompt(self.tokenizer, prompt=prompt, messages=messages, raw=raw)

    def check_request(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Refuse what can never run, with a message for the user. Safe to call from any thread."""
        params.validate()
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        if any(not 0 <= t < self.vocab_size for t in prompt_ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {self.vocab_size})")
        if len(prompt_ids) >= self.context_length:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens but the model's context is {self.context_length}; shorten it"
            )
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
    ) -> Request:
        params = params or SamplingParams()
        self.check_request(prompt_ids, params)
        request = Request(request_id or new_request_id(), list(prompt_ids), params, tag=tag)
        if arrival_time is not None:
            request.arrival_time = arrival_time
        if request.request_id in self.requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.detokenizers[request.request_id] = IncrementalDetokenizer(self.tokenizer, request.prompt_ids, params.stop)
        self.scheduler.add(request)
        return request

    def abort(self, request_id: str) -> TokenEvent | None:
        """Cancel a request; its pages return to the pool at once. Unknown or finished ids are ignored."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return None
        event = self._finish(request, FinishReason.ABORT, time.monotonic())
        self._publish_page_map(force=True)
        return event

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- the step ---------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        started = time.monotonic()
        out = self.scheduler.schedule()
        events: list[TokenEvent] = []
        for request in out.out_of_pages:
            events.append(self._finish(request, FinishReason.LENGTH, started))
        for request in out.admitted:
            if request.first_scheduled_time is None:
                request.first_scheduled_time = started
        if not out.chunks:
            return events

        forward_s = 0.0
        try:
            if self.fault_injector is not None:
                self.fault_injector(out)
            result = self.runner.execute(out.chunks)
            forward_s = result.forward_s
            for chunk in out.chunks:
                self.scheduler.commit(chunk)
            sampled = [c.request for c in result.sampling_chunks]
            tokens = self.sampler.sample(result.logits, sampled) if sampled else []
        except Exception as exc:  # fail this step's requests, keep serving the rest
            log.exception("engine step %d failed", self.step_count)
            message = f"the engine failed while running this request: {type(exc).__name__}: {exc}"
            now = time.monotonic()
            for chunk in out.chunks:
                if not chunk.request.is_finished:
                    events.append(self._finish(chunk.request, FinishReason.ERROR, now, error=message))
            self._record_step(out, started, forward_s, events)
            return events

        now = time.monotonic()
        token_records: list[TokenRecord] = []
        for request, token in zip(sampled, tokens, strict=True):
            previous = request.token_times[-1] if request.token_times else request.arrival_time
            request.output_ids.append(token)
            request.token_times.append(now)
            token_records.append(
                TokenRecord(request.request_id, request.tag, now, len(request.output_ids) - 1, now - previous)
            )
            detok = self.detokenizers[request.request_id]
            text = detok.add(token)
            reason = self._stop_reason(request, token, detok)
            if reason is None:
                events.append(TokenEvent(request.request_id, request.tag, [token], text, now))
            else:
                events.append(self._finish(request, reason, now, token_ids=[token], text=text))
        self.metrics.record_tokens(token_records)
        self._record_step(out, started, forward_s, events)
        return events

    def _stop_reason(self, request: Request, token: int, detok: IncrementalDetokenizer) -> FinishReason | None:
        params = request.params
        if token in params.stop_token_ids or (token in self.eos_ids and not params.ignore_eos):
            return FinishReason.STOP
        if detok.stopped:
            return FinishReason.STOP
        if len(request.output_ids) >= params.max_tokens or request.num_tokens >= self.context_length:
            return FinishReason.LENGTH
        return None

    def _finish(
        self,
        request: Request,
        reason: FinishReason,
        now: float,
        *,
        token_ids: list[int] | None = None,
        text: str = "",
        error: str | None = None,
    ) -> TokenEvent:
        self.scheduler.finish(request, reason)
        request.finish_time = now
        request.error = error
        detok = self.detokenizers.pop(request.request_id, None)
        if detok is not None and reason is not FinishReason.ERROR:
            text += detok.flush()
        self.requests.pop(request.request_id, None)
        stats = request.stats()
        self.metrics.record_finished({"request_id": request.request_id, "tag": request.tag, **asdict(stats)})
        return TokenEvent(
            request.request_id,
            request.tag,
            token_ids or [],
            text,
            now,
            finished=True,
            finish_reason=reason.value,
            stats=stats,
            error=error,
        )

    # ---- metrics ----------------------------------------------------------------------------
    def _record_step(self, out: SchedulerOutput, started: float, forward_s: float, events: list[TokenEvent]) -> None:
        self.step_count += 1
        self._publish_page_map(force=bool(out.admitted or out.preempted or any(e.finished for e in events)))
        pool = self.pool
        # shared pages are full prefix pages: every reference beyond the first counts them twice
        used_slots = sum(r.num_computed for r in self.scheduler.running) - pool.extra_refs * pool.page_size
        cached_free = pool.num_cached_free
        self.metrics.record_step(
            StepRecord(
                step=self.step_count,
                start=started,
                duration_s=time.monotonic() - started,
                forward_s=forward_s,
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

    def kv_pages_needed(self, tokens: int) -> int:
        return math.ceil(tokens / self.pool.page_size)
