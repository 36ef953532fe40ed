"""ApiServer: the OpenAI-compatible API's state and generation over an EngineThread (the routes are in app.py)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from fastapi import Request
from fastapi.responses import StreamingResponse
from prometheus_client import CollectorRegistry, ProcessCollector
from starlette.background import BackgroundTask

from engine.core.engine_thread import EngineThread
from engine.core.tools import parse_calls
from engine.errors import EngineStoppedError, InvalidRequestError, PromptTooLongError
from engine.handle import RequestHandle
from engine.serve.completions_wire import TOOL_CALLS, RequestKind, ResponseWriter, usage
from engine.serve.event_bridge import AsyncEventBridge
from engine.serve.limits import ServeLimits
from engine.serve.openai_protocol import (
    ApiError,
    GenerationRequest,
    bad_request,
)
from engine.serve.prometheus import EngineCollector, LiveState, live_state_of
from engine.serve.tool_stream import ToolCallStream
from engine.types import FinishReason, SamplingParams, TokenEvent, TokenLogprob

log = logging.getLogger(__name__)

API_TAG = "api"  # the tag API requests carry in the engine (shown in the dashboard's page map)
DISCONNECT_POLL_S = 0.1  # how soon a vanished client's whole (non-streamed) reply stops: a cheap ASGI check


def _blamed(param: str | None, gen: GenerationRequest) -> str | None:
    """The request field an engine error names: a grammar is the field's that asked for it (response_format, a
    guided_* field, structured_outputs, or a forced call's tools)."""
    if param == "structured":
        return gen.structured_param or ("tools" if gen.tools else "response_format")
    return param


def _tool_reason(reason: FinishReason | None) -> FinishReason | str | None:
    """A reply that called tools ends with "tool_calls" where it ended by itself (at the call's end)."""
    return TOOL_CALLS if reason is FinishReason.STOP else reason


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


async def _errors_said_in_stream(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """The chunks; an ApiError raised once the stream has begun (it waited too long in the queue, its client stopped
    reading) is said in the stream, in OpenAI's shape, before [DONE]."""
    try:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield chunk
    except ApiError as exc:
        yield _sse(exc.body())
        yield _sse("[DONE]")


class ApiServer:
    """The routes' shared state: the engine thread, the name clients call the model by, the optional key."""

    def __init__(
        self, worker: EngineThread, model_name: str, api_key: str | None = None, limits: ServeLimits | None = None
    ) -> None:
        self.worker = worker
        self.model_name = model_name
        self._api_key = api_key.encode() if api_key else None
        self.limits = limits or ServeLimits()
        self._admitting = 0  # requests between the queue check and their handle (tokenizing)
        # what one request can hold: the model's context, or the KV pool where that is smaller (a request cannot hold
        # more pages than the pool has; advertising the model's would accept replies the pool then cuts short)
        engine = worker.engine
        self.context_length: int = min(engine.context_length, engine.pool_tokens)
        self.created = int(time.time())
        self.bridge: AsyncEventBridge | None = None
        self.active: dict[str, RequestHandle] = {}  # requests being answered, by id
        self.registry = CollectorRegistry()
        runtime = worker.engine.runtime_record()
        self.registry.register(
            EngineCollector(
                worker.metrics, model_name, live=self._live_state, runtime=runtime, context_length=self.context_length
            )
        )
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes & co, as vLLM exposes them

    def _live_state(self) -> LiveState | None:
        if not self.worker.alive:
            return None
        try:
            return self.worker.call(live_state_of).result(timeout=1.0)
        except TimeoutError:  # a long step is running: the last step's figures will do
            return None

    # ---- checks -----------------------------------------------------------------------------
    def check_key(self, request: Request) -> None:
        if self._api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # compare_digest: the time taken must not reveal how much of a guessed key was right
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._api_key):
            raise ApiError(
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                code="invalid_api_key",
            )

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(
                404,
                f"the model '{name}' does not exist here; this server serves '{self.model_name}' (GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    def check_alive(self) -> None:
        problem = self.worker.health() if self.bridge is not None else "the server is stopping"
        if problem is not None:
            raise ApiError(503, f"the engine is not available: {problem}", type="server_error")

    def check_queue(self) -> None:
        """429 when too many API requests wait for their first token (the window's chats queue without limit)."""
        waiting = self._admitting + sum(1 for h in list(self.active.values()) if not h.output_tokens and not h.done)
        limit = self.limits.max_waiting
        if waiting >= limit:
            retry = self.limits.retry_after_s
            raise ApiError(
                429,
                f"the server is busy: {waiting} requests are waiting (at most {limit}); retry in {retry} s",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(retry)},
            )

    def params_for(self, gen: GenerationRequest, prompt_tokens: int) -> SamplingParams:
        """The request's sampling parameters, its token limit checked against what the context leaves (as vLLM
        does: a 400 rather than a reply silently cut at the context's end)."""
        context = self.context_length
        room = context - prompt_tokens
        if prompt_tokens >= context:
            return gen.params  # the engine refuses the prompt itself (context_length_exceeded)
        if gen.params.min_tokens > room:
            raise bad_request(
                f"'min_tokens' is too large: {gen.params.min_tokens}; the context leaves {room} tokens for the reply",
                "min_tokens",
                code="context_length_exceeded",
            )
        param = gen.max_tokens_param
        if param is None:
            return replace(gen.params, max_tokens=context)  # until the context ends
        wanted = gen.params.max_tokens
        if wanted > room:
            raise bad_request(
                f"'{param}' is too large: {wanted}. This model's maximum context length is {context} tokens and "
                f"your request has {prompt_tokens} input tokens ({wanted} > {context} - {prompt_tokens})",
                param,
                code="context_length_exceeded",
            )
        return gen.params

    # ---- generation -------------------------------------------------------------------------
    def _submit_now(self, gen: GenerationRequest, request_id: str) -> RequestHandle:
        """Tokenize, check the token limit, queue (in a worker thread: the chat template is CPU work)."""
        ids = gen.prompt_ids
        if ids is None:
            ids = self.worker.engine.encode(
                prompt=gen.prompt, messages=gen.messages, raw=gen.kind is RequestKind.COMPLETION, tools=gen.tools
            )
        params = self.params_for(gen, len(ids))
        assert self.bridge is not None
        return self.worker.submit(ids, params=params, tag=API_TAG, request_id=request_id, sink=self.bridge.sink)

    async def submit(self, gen: GenerationRequest, request_id: str) -> tuple[RequestHandle, asyncio.Queue]:
        assert self.bridge is not None
        self.check_queue()
        queue = self.bridge.register(request_id)
        param = "messages" if gen.kind is RequestKind.CHAT else "prompt"
        self._admitting += 1
        try:
            handle = await asyncio.to_thread(self._submit_now, gen, request_id)
        except BaseException as exc:
            self.bridge.unregister(request_id)
            if isinstance(exc, PromptTooLongError):
                raise bad_request(str(exc), param, code="context_length_exceeded") from None
            if isinstance(exc, InvalidRequestError):
                raise bad_request(str(exc), _blamed(exc.param, gen) or param) from None
            if isinstance(exc, EngineStoppedError):
                raise ApiError(503, str(exc), type="server_error") from None
            raise
        finally:
            self._admitting -= 1
        self.active[request_id] = handle
        return handle, queue

    def cancel_all(self) -> None:
        """Cancel every request being answered (the server is stopping); thread-safe."""
        for handle in list(self.active.values()):
            handle.cancel()

    async def events(self, handle: RequestHandle, queue: asyncio.Queue) -> AsyncIterator[TokenEvent]:
        assert self.bridge is not None
        try:
            stream = self.bridge.stream(handle, queue, queue_wait_s=self.limits.max_queue_wait_s)
            async with contextlib.aclosing(stream) as events:
                async for event in events:
                    yield event
        finally:
            self.active.pop(handle.request_id, None)

    @staticmethod
    def failure(event: TokenEvent, gen: GenerationRequest) -> ApiError | None:
        """Why a finished request has no proper answer: its own part the engine gave up on (its grammar: a 400
        naming the field), the engine failed, or the server cancelled it."""
        if event.finish_reason is FinishReason.ERROR and event.error_param is not None:
            return bad_request(event.error or "the request cannot be completed", _blamed(event.error_param, gen))
        if event.finish_reason is FinishReason.ERROR:
            return ApiError(500, event.error or "the engine failed", type="server_error")
        if event.finish_reason is FinishReason.ABORT:
            return ApiError(503, "the request was cancelled: the server is stopping", type="server_error")
        return None

    @staticmethod
    def token_counts(handle: RequestHandle, final: TokenEvent) -> tuple[int, int, int]:
        """(prompt tokens, output tokens, prompt tokens found in the prefix cache) of a finished request."""
        stats = final.stats
        completion = stats.output_tokens if stats else handle.output_tokens
        return handle.prompt_tokens, completion, stats.cached_prompt_tokens if stats else 0

    def usage_of(self, handle: RequestHandle, final: TokenEvent) -> dict:
        return usage(*self.token_counts(handle, final))

    async def collect(
        self, request: Request, gen: GenerationRequest, request_id: str
    ) -> tuple[RequestHandle, str, TokenEvent, list[TokenLogprob] | None]:
        """Run a request to its end for a whole (non-streamed) answer: its handle, text, final event and logprobs.
        A client that leaves cancels it; a failed or cancelled request raises its ApiError."""
        handle, queue = await self.submit(gen, request_id)

        async def cancel_when_client_leaves() -> None:
            while not await request.is_disconnected():
                await asyncio.sleep(DISCONNECT_POLL_S)
            log.info("request %s cancelled: the client went away", handle.request_id)
            handle.cancel()

        watcher = asyncio.create_task(cancel_when_client_leaves())
        parts: list[str] = []
        logprobs: list[TokenLogprob] | None = [] if gen.params.logprobs is not None else None
        final: TokenEvent | None = None
        try:
            async with contextlib.aclosing(self.events(handle, queue)) as events:
                async for event in events:
                    parts.append(event.text)
                    if logprobs is not None and event.logprobs:
                        logprobs += event.logprobs
                    final = event if event.finished else final
        finally:
            watcher.cancel()
        assert final is not None
        failure = self.failure(final, gen)
        if failure is not None:
            raise failure
        return handle, "".join(parts), final, logprobs

    async def whole(self, request: Request, gen: GenerationRequest, writer: ResponseWriter) -> dict:
        handle, text, final, logprobs = await self.collect(request, gen, writer.id)
        reason, calls = final.finish_reason, None
        if gen.tools:
            text, found = parse_calls(text, cut=reason is FinishReason.LENGTH)
            if found:
                calls, reason = [call.openai() for call in found], _tool_reason(reason)
        return writer.whole(text, reason, self.usage_of(handle, final), logprobs=logprobs, tool_calls=calls)

    async def stream(self, gen: GenerationRequest, writer: ResponseWriter) -> StreamingResponse:
        handle, queue = await self.submit(gen, writer.id)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        # The background task runs after the response, even when the client left before the first chunk and the
        # generator never started (its own cleanup would then never run).
        return StreamingResponse(
            _errors_said_in_stream(self._sse_events(gen, writer, handle, queue)),
            media_type="text/event-stream",
            headers=headers,
            background=BackgroundTask(self.release, handle),
        )

    def release(self, handle: RequestHandle) -> None:
        """Forget a request whose response has ended; cancel it if it still runs (nobody is listening)."""
        if self.bridge is not None:
            self.bridge.unregister(handle.request_id)
        self.active.pop(handle.request_id, None)
        if not handle.done:
            handle.cancel()

    async def _sse_events(
        self, gen: GenerationRequest, writer: ResponseWriter, handle: RequestHandle, queue: asyncio.Queue
    ) -> AsyncIterator[str]:
        with_usage = gen.include_usage
        if gen.kind is RequestKind.CHAT:
            # content null when the reply may be tool calls, as OpenAI sends it ("" makes the SDK report a text delta)
            yield _sse(writer.chunk(None if gen.tools else "", first=True, with_usage=with_usage))
        # aclosing: when the client disconnects, Starlette cancels this generator, and the engine request must
        # be cancelled with it (the bridge's stream does that in its finally)
        calls = ToolCallStream() if gen.tools else None
        async with contextlib.aclosing(self.events(handle, queue)) as events:
            async for event in events:
                text, deltas = calls.feed(event.text) if calls is not None else (event.text, [])
                if event.finished and calls is not None:
                    rest, last = calls.finish(cut=event.finish_reason is FinishReason.LENGTH)
                    text, deltas = text + rest, deltas + last
                if text or deltas or event.logprobs:
                    yield _sse(writer.chunk(text, with_usage=with_usage, logprobs=event.logprobs, tool_calls=deltas))
                if not event.finished:
                    continue
                failure = self.failure(event, gen)
                if failure is not None:
                    yield _sse(failure.body())
                    break
                reason = event.finish_reason
                if calls is not None and calls.called:
                    reason = _tool_reason(reason)
                yield _sse(writer.chunk(None, reason, with_usage=with_usage))
                if with_usage:
                    yield _sse(writer.usage_chunk(self.usage_of(handle, event)))
        yield _sse("[DONE]")
