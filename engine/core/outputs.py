"""Sampled tokens into TokenEvents: incremental text, stop checks, finished requests and their token timings."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.grammar import GrammarFailedError
from engine.core.metrics import MetricsRecorder, TokenRecord
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.types import FinishReason, TokenEvent, TokenLogprob

log = logging.getLogger(__name__)


class OutputProcessor:
    """Owns each live request's detokenizer; finishing a request (for any reason) goes through finish()."""

    def __init__(
        self, tokenizer, eos_ids: set[int], context_length: int, scheduler: Scheduler, metrics: MetricsRecorder
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.context_length = context_length
        self.scheduler = scheduler
        self.metrics = metrics
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}

    def add(self, request: Request) -> None:
        self.detokenizers[request.request_id] = IncrementalDetokenizer(
            self.tokenizer, request.prompt_ids, request.params.stop
        )

    def process(
        self,
        requests: Sequence[Request],
        tokens: Sequence[Sequence[int]],
        now: float,
        logprobs: Sequence[list[TokenLogprob] | None] | None = None,
    ) -> list[TokenEvent]:
        """The new tokens of each request that sampled this step (one, or several where a draft was accepted), in
        order: one event per request, ending it at the first token that stops it (later ones are dropped)."""
        events: list[TokenEvent] = []
        records: list[TokenRecord] = []
        logprobs = logprobs or [None] * len(requests)
        for request, new, lps in zip(requests, tokens, logprobs, strict=True):
            detok = self.detokenizers[request.request_id]
            kept: list[int] = []
            text = ""
            reason = None
            try:
                for index, token in enumerate(new):
                    if request.matcher is not None:
                        request.matcher.consume(token)  # first: a token the grammar refuses is not the reply's
                    previous = request.token_times[-1] if request.token_times else request.arrival_time
                    request.output_ids.append(token)
                    request.token_times.append(now)
                    count = len(request.output_ids) - 1
                    records.append(TokenRecord(request.request_id, request.tag, now, count, now - previous, index > 0))
                    kept.append(token)
                    text += detok.add(token)
                    reason = self._stop_reason(request, token, detok)
                    if reason is not None:
                        break
            except GrammarFailedError as exc:  # the request's own grammar: it ends with the reason, step-mates go on
                log.info("request %s: %s", request.request_id, exc)
                events.append(self.finish(request, FinishReason.ERROR, now, token_ids=kept, text=text, error=str(exc),
                                          error_param=exc.param))  # fmt: skip
                continue
            except Exception as exc:  # one request's text cannot be made: fail it, not its step-mates
                log.exception("detokenizing request %s failed", request.request_id)
                error = f"the engine could not turn this reply's tokens into text: {type(exc).__name__}: {exc}"
                events.append(self.finish(request, FinishReason.ERROR, now, token_ids=kept, error=error))
                continue
            if lps is not None:
                lps = lps[: len(kept)]  # the tokens after a stop were dropped
            if reason is None:
                events.append(TokenEvent(request.request_id, request.tag, kept, text, now, logprobs=lps))
            else:
                event = self.finish(request, reason, now, token_ids=kept, text=text)
                event.logprobs = lps
                events.append(event)
        self.metrics.record_tokens(records)
        return events

    def _stop_reason(self, request: Request, token: int, detok: IncrementalDetokenizer) -> FinishReason | None:
        params = request.params
        if token in params.stop_token_ids or (token in self.eos_ids and not params.ignore_eos):
            return FinishReason.STOP
        if detok.stopped or (request.matcher is not None and request.matcher.finished):
            return FinishReason.STOP
        if len(request.output_ids) >= params.max_tokens or request.num_tokens >= self.context_length:
            return FinishReason.LENGTH
        return None

    def finish(
        self,
        request: Request,
        reason: FinishReason,
        now: float,
        *,
        token_ids: list[int] | None = None,
        text: str = "",
        error: str | None = None,
        error_param: str | None = None,
    ) -> TokenEvent:
        """End the request: its pages go back at once, the text held back is flushed, its stats recorded."""
        self.scheduler.finish(request, reason)
        request.finish_time = now
        request.error = error
        detok = self.detokenizers.pop(request.request_id, None)
        if detok is not None and reason is not FinishReason.ERROR:
            text += detok.flush()
        stats = request.stats()
        self.metrics.record_finished({"request_id": request.request_id, "tag": request.tag, **asdict(stats)})
        return TokenEvent(
            request.request_id, request.tag, token_ids or [], text, now,
            finished=True, finish_reason=reason, stats=stats, error=error, error_param=error_param,
        )  # fmt: skip
