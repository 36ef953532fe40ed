"""The Responses API (POST /v1/responses, GET /v1/responses/{id}) over the ApiServer's generation: the subset a local
text model serves, as vLLM serves it: text or message input, instructions, function tools with their calls and
outputs, text.format json_schema, streaming events, previous_response_id within the server's lifetime."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from engine.core.tools import parse_calls
from engine.handle import RequestHandle
from engine.serve.api_server import ApiServer
from engine.serve.openai_protocol import ApiError
from engine.serve.response_store import ResponseStore
from engine.serve.responses_events import (
    ResponseEvents,
    ResponseObject,
    conversation_after,
    output_items,
    response_usage,
)
from engine.serve.responses_request import ResponsesRequest, parse_responses_request
from engine.serve.tool_stream import ToolCallStream
from engine.types import FinishReason

INCOMPLETE = "max_output_tokens"  # OpenAI's reason for a response cut by its token limit


def _sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


class ResponsesApi:
    """Answers Responses requests with the ApiServer's engine, and keeps what previous_response_id needs."""

    def __init__(self, server: ApiServer, store: ResponseStore | None = None) -> None:
        self.server = server
        self.store = store or ResponseStore()

    def retrieve(self, response_id: str) -> dict:
        found = self.store.get(response_id)
        if found is None:
            message = f"no response {response_id!r} here (created with store: false, or forgotten)"
            raise ApiError(404, message, type="not_found_error", param="response_id", code="response_not_found")
        return found.response

    async def create(self, request: Request, body: object) -> Response:
        server = self.server
        parsed = parse_responses_request(body, self.store, server.limits)
        server.check_model(parsed.gen.model)
        server.check_alive()
        response = ResponseObject(parsed, server.model_name)
        if parsed.gen.stream:
            return await self._stream(parsed, response)
        return JSONResponse(await self._whole(request, parsed, response))

    def _keep(self, parsed: ResponsesRequest, body: dict) -> None:
        if parsed.store:
            self.store.put(body, conversation_after(parsed, body["output"]))

    async def _whole(self, request: Request, parsed: ResponsesRequest, response: ResponseObject) -> dict:
        server = self.server
        handle, text, final, _ = await server.collect(request, parsed.gen, response.id)
        cut = final.finish_reason is FinishReason.LENGTH
        calls = []
        if parsed.gen.tools:
            text, calls = parse_calls(text, cut=cut)
        status = "incomplete" if cut else "completed"
        usage = response_usage(*server.token_counts(handle, final))
        output = output_items(text, calls, status)
        body = response.body(status, output, usage, incomplete=INCOMPLETE if cut else None)
        self._keep(parsed, body)
        return body

    async def _stream(self, parsed: ResponsesRequest, response: ResponseObject) -> StreamingResponse:
        handle, queue = await self.server.submit(parsed.gen, response.id)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(
            self._events(parsed, response, handle, queue),
            media_type="text/event-stream",
            headers=headers,
            background=BackgroundTask(self.server.release, handle),
        )

    async def _events(
        self, parsed: ResponsesRequest, response: ResponseObject, handle: RequestHandle, queue
    ) -> AsyncIterator[str]:
        server = self.server
        events = ResponseEvents(response)
        for event in events.start():
            yield _sse(event)
        calls = ToolCallStream() if parsed.gen.tools else None
        async with contextlib.aclosing(server.events(handle, queue)) as stream:
            async for token_event in stream:
                text, deltas = calls.feed(token_event.text) if calls is not None else (token_event.text, [])
                cut = token_event.finish_reason is FinishReason.LENGTH
                if token_event.finished and calls is not None:
                    rest, last = calls.finish(cut=cut)
                    text, deltas = text + rest, deltas + last
                for event in events.text(text) + events.tool_deltas(deltas):
                    yield _sse(event)
                if not token_event.finished:
                    continue
                failure = server.failure(token_event, parsed.gen)
                if failure is not None:
                    for event in events.fail(failure.message):
                        yield _sse(event)
                    break
                usage = response_usage(*server.token_counts(handle, token_event))
                status = "incomplete" if cut else "completed"
                finished = events.finish(status, usage, INCOMPLETE if cut else None)
                self._keep(parsed, finished[-1]["response"])
                for event in finished:
                    yield _sse(event)
