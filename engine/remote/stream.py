"""One OpenAI-style streamed reply, read on the client: chunks to text deltas and timings, failures in words."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from engine.errors import RemoteError
from engine.types import (
    Alternative,
    FinishReason,
    RequestStats,
    SamplingParams,
    StructuredKind,
    StructuredOutput,
    TokenLogprob,
)


class StatusError(Exception):
    """The server answered with an HTTP error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_message(response_body: bytes) -> str:
    """The message of an OpenAI-style error body (or FastAPI's 'detail'), else the start of what came back."""
    try:
        body = json.loads(response_body)
        error = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if isinstance(body, dict) and body.get("detail"):
            return str(body["detail"])
    except (ValueError, AttributeError):
        pass
    return response_body[:300].decode("utf-8", "replace").strip() or "no details"


async def sse_chunks(lines: AsyncIterator[str], name: str) -> AsyncIterator[dict]:
    """The JSON chunks of an OpenAI-style server-sent event stream, up to `data: [DONE]`; an error chunk or a chunk
    that is not JSON raises RemoteError."""
    async for line in lines:
        if not line.startswith("data:"):
            continue  # blank separators, comments, event names
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise RemoteError(f"{name} sent a stream chunk that is not JSON: {payload[:100]!r}") from None
        if isinstance(chunk, dict) and "error" in chunk:
            raise RemoteError(f"{name}: {error_message(payload.encode())}")
        if not isinstance(chunk, dict):
            raise RemoteError(f"{name} sent a stream chunk that is not a JSON object: {payload[:100]!r}")
        yield chunk


def status_message(name: str, status: int, message: str) -> str:
    hint = ""
    if status in (401, 403):
        hint = "; check the endpoint's API key"
    elif status == 404:
        hint = "; check the base URL and the model name"
    return f"{name} answered {status}: {message}{hint}"


def transport_message(name: str, exc: httpx.HTTPError, url: str, connect_s: float, read_s: float) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return f"{name}: could not connect to {url} within {connect_s:g} s"
    if isinstance(exc, httpx.ConnectError):
        return f"{name}: could not connect to {url} ({exc or 'connection refused'}); is the server up?"
    if isinstance(exc, httpx.ReadTimeout):
        return (
            f"{name}: no answer from {url} for {read_s:g} s; the server may be stalled or overloaded (request stopped)"
        )
    if isinstance(exc, httpx.TimeoutException):
        return f"{name}: {url} timed out ({type(exc).__name__})"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"{name}: the server closed the connection mid-reply ({exc})"
    return f"{name}: {type(exc).__name__}: {exc}"


def structured_fields(structured: StructuredOutput) -> dict:
    """OpenAI's response_format for JSON; vLLM's structured_outputs for a regex, a choice or a grammar."""
    if structured.kind is StructuredKind.JSON_OBJECT:
        return {"response_format": {"type": "json_object"}}
    if structured.kind is StructuredKind.JSON_SCHEMA:
        schema = json.loads(structured.spec)
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}}
    value = json.loads(structured.spec) if structured.kind is StructuredKind.CHOICE else structured.spec
    return {"structured_outputs": {structured.kind.value: value}}


def sampling_fields(params: SamplingParams, chat: bool = True) -> dict:
    """The request fields for these settings, as OpenAI's API (and vLLM's extras) name them."""
    fields: dict = {"max_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p}
    if params.logprobs is not None:
        fields.update({"logprobs": True, "top_logprobs": params.logprobs} if chat else {"logprobs": params.logprobs})
    if params.logit_bias:
        fields["logit_bias"] = {str(token): bias for token, bias in params.logit_bias}
    if params.structured is not None:
        fields.update(structured_fields(params.structured))
    if params.stop_token_ids:
        fields["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        fields["seed"] = params.seed
    if params.stop:
        fields["stop"] = list(params.stop)
    for name in ("presence_penalty", "frequency_penalty"):  # OpenAI's own fields
        if getattr(params, name):
            fields[name] = getattr(params, name)
    # vLLM's extensions: sent only when used, since strict servers (OpenAI's own) refuse unknown fields
    if params.top_k:
        fields["top_k"] = params.top_k
    if params.min_p:
        fields["min_p"] = params.min_p
    if params.repetition_penalty != 1.0:
        fields["repetition_penalty"] = params.repetition_penalty
    if params.ignore_eos:
        fields["ignore_eos"] = True
    if params.min_tokens:
        fields["min_tokens"] = params.min_tokens
    return fields


def chunk_logprobs(chunk: dict) -> list[TokenLogprob] | None:
    """The logprobs a chunk carries (chat: logprobs.content; completions: tokens, token_logprobs, top_logprobs)."""
    found: list[TokenLogprob] = []
    for choice in chunk.get("choices") or []:
        block = choice.get("logprobs") or {}
        for item in block.get("content") or []:
            top = tuple(
                Alternative(t.get("token", ""), float(t.get("logprob", 0.0))) for t in item.get("top_logprobs") or []
            )
            found.append(TokenLogprob(item.get("token", ""), float(item.get("logprob", 0.0)), top))
        tops = block.get("top_logprobs") or []
        for index, (token, logprob) in enumerate(
            zip(block.get("tokens") or [], block.get("token_logprobs") or [], strict=False)
        ):
            top = tuple(Alternative(t, float(v)) for t, v in (tops[index] if index < len(tops) else {}).items())
            found.append(TokenLogprob(token, float(logprob or 0.0), top))
    return found or None


@dataclass
class StreamState:
    """What the client has seen of one reply so far; its stats are measured here, on the client."""

    request_id: str
    tag: str
    started: float
    finish_reason: FinishReason | None = None
    usage: dict | None = None
    token_times: list[float] = field(default_factory=list)
    tool_calls: dict[int, dict] = field(default_factory=dict)  # by index, their deltas joined

    def apply(self, chunk: dict) -> tuple[str, bool]:
        """Take one chunk (chat or completion shape): its text, and whether it carried a finish reason."""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        text, finished = "", False
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
            text += piece or ""
            for delta in (choice.get("delta") or {}).get("tool_calls") or []:
                self._join_call(delta)
            if choice.get("finish_reason"):
                reason = choice["finish_reason"]  # content_filter, tool_calls, eos...: the reply ended normally
                self.finish_reason = FinishReason.LENGTH if reason == FinishReason.LENGTH else FinishReason.STOP
                finished = True
        return text, finished

    def _join_call(self, delta: dict) -> None:
        call = self.tool_calls.setdefault(int(delta.get("index", 0)), {"type": "function", "function": {}})
        if delta.get("id"):
            call["id"] = delta["id"]
        function = delta.get("function") or {}
        if function.get("name"):
            call["function"]["name"] = function["name"]
        call["function"]["arguments"] = call["function"].get("arguments", "") + (function.get("arguments") or "")

    @property
    def calls(self) -> list[dict] | None:
        return [self.tool_calls[i] for i in sorted(self.tool_calls)] or None

    def stats(self, reason: FinishReason, now: float) -> RequestStats:
        usage = self.usage or {}
        times = self.token_times
        output = usage.get("completion_tokens") or len(times)  # one chunk ~ one token when the server gives no usage
        decode_rate = None
        if len(times) > 1 and times[-1] > times[0]:
            decode_rate = (output - 1) / (times[-1] - times[0])
        return RequestStats(
            prompt_tokens=usage.get("prompt_tokens") or 0,
            cached_prompt_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
            output_tokens=output,
            ttft_s=times[0] - self.started if times else None,
            decode_tokens_per_s=decode_rate,
            e2e_s=now - self.started,
            queue_s=None,
            preemptions=0,
            finish_reason=reason,
            inter_token_s=[b - a for a, b in itertools.pairwise(times)],
        )
