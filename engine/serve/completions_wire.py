"""The wire format of the chat completions and completions APIs' answers: whole responses, stream chunks, usage, finish
reasons (the Responses API's are in responses_api.py)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from enum import StrEnum

from engine.types import FinishReason, TokenLogprob


class RequestKind(StrEnum):
    """Which OpenAI endpoint a request came through, which decides its answer's shape."""

    CHAT = "chat"  # /v1/chat/completions: messages in, a message (or its deltas) out
    COMPLETION = "completion"  # /v1/completions: a prompt in, text out


TOOL_CALLS = "tool_calls"  # the finish reason of a reply that called tools
#: what JSON carries for a log probability of minus infinity (a token the grammar or a bias ruled out), as vLLM
LOGPROB_FLOOR = -9999.0


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def finish_reason(engine_reason: FinishReason | str | None) -> str | None:
    """The engine's reasons map onto OpenAI's; an aborted request only happens when the client left."""
    if engine_reason is None or engine_reason == TOOL_CALLS:
        return engine_reason
    reason = FinishReason(engine_reason)
    return str(reason) if reason.completed else str(FinishReason.STOP)


def _logprob(value: float) -> float:
    return value if math.isfinite(value) else LOGPROB_FLOOR


def _token(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": _logprob(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(items: Sequence[TokenLogprob]) -> dict:
    """The chat API's logprobs: per token its text, log probability, bytes and top alternatives (best first)."""
    content = [{**_token(i.text, i.logprob), "top_logprobs": [_token(a.text, a.logprob) for a in i.top]} for i in items]
    return {"content": content, "refusal": None}


def completion_logprobs(items: Sequence[TokenLogprob], offset: int) -> dict:
    """The completions API's logprobs: parallel lists of tokens, their log probabilities, {token: logprob} of the
    top alternatives and each token's offset in the reply's text (from `offset`)."""
    offsets = []
    for item in items:
        offsets.append(offset)
        offset += len(item.text)
    return {
        "tokens": [i.text for i in items],
        "token_logprobs": [_logprob(i.logprob) for i in items],
        "top_logprobs": [{a.text: _logprob(a.logprob) for a in i.top} for i in items],
        "text_offset": offsets,
    }


def _as_ids(item: TokenLogprob) -> TokenLogprob:
    top = tuple(replace(a, text=f"token_id:{a.token_id}") for a in item.top)
    return replace(item, text=f"token_id:{item.token_id}", top=top)


class ResponseWriter:
    """Builds the JSON objects of one reply, chat or completion, whole or as stream chunks."""

    def __init__(self, kind: RequestKind, response_id: str, model: str, tokens_as_ids: bool = False) -> None:
        self.kind = RequestKind(kind)
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.tokens_as_ids = tokens_as_ids
        self._offset = 0  # characters of the completion written so far (its logprobs' text offsets)

    def _envelope(self, chunk: bool) -> dict:
        obj = "text_completion"
        if self.kind is RequestKind.CHAT:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _logprobs(self, items: Sequence[TokenLogprob] | None, text: str) -> dict | None:
        if items is None:
            return None
        if self.tokens_as_ids:
            items = [_as_ids(i) for i in items]
        if self.kind is RequestKind.CHAT:
            return chat_logprobs(items)
        logprobs = completion_logprobs(items, self._offset)
        self._offset += len(text)
        return logprobs

    def whole(
        self,
        text: str,
        reason: FinishReason | str | None,
        usage_: dict,
        *,
        logprobs: Sequence[TokenLogprob] | None = None,
        tool_calls: list[dict] | None = None,
    ) -> dict:
        if self.kind is RequestKind.CHAT:
            message: dict = {"role": "assistant", "content": text}
            if tool_calls:
                message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
            choice = {"index": 0, "message": message, "logprobs": self._logprobs(logprobs, text)}
        else:
            choice = {"index": 0, "text": text, "logprobs": self._logprobs(logprobs, text)}
        choice["finish_reason"] = finish_reason(reason)
        return {**self._envelope(False), "choices": [choice], "usage": usage_}

    def chunk(
        self,
        text: str | None,
        reason: FinishReason | str | None = None,
        *,
        first: bool = False,
        with_usage: bool,
        logprobs: Sequence[TokenLogprob] | None = None,
        tool_calls: list[dict] | None = None,
    ) -> dict:
        if self.kind is RequestKind.CHAT:
            delta: dict = {"role": "assistant", "content": text} if first else {}
            if not first and text:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"index": 0, "delta": delta, "logprobs": self._logprobs(logprobs, text or "")}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": self._logprobs(logprobs, text or "")}
        choice["finish_reason"] = finish_reason(reason)
        body = {**self._envelope(True), "choices": [choice]}
        if with_usage:
            body["usage"] = None  # OpenAI: null in every chunk but the last when include_usage is set
        return body

    def usage_chunk(self, usage_: dict) -> dict:
        return {**self._envelope(True), "choices": [], "usage": usage_}
