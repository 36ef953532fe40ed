"""The OpenAI wire format's answers: whole responses, stream chunks, usage, finish reasons."""

from __future__ import annotations

import time

from engine.types import FinishReason


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def finish_reason(engine_reason: FinishReason | None) -> str | None:
    """The engine's reasons map onto OpenAI's; an aborted request only happens when the client left."""
    if engine_reason is None:
        return None
    reason = FinishReason(engine_reason)
    return str(reason) if reason.completed else str(FinishReason.STOP)


class ResponseWriter:
    """Builds the JSON objects of one reply, chat or completion, whole or as stream chunks."""

    def __init__(self, kind: str, response_id: str, model: str) -> None:
        self.kind = kind
        self.id = response_id
        self.model = model
        self.created = int(time.time())

    def _envelope(self, chunk: bool) -> dict:
        obj = "text_completion"
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, reason: FinishReason | None, usage_: dict) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish_reason(reason)
        return {**self._envelope(False), "choices": [choice], "usage": usage_}

    def chunk(
        self, text: str | None, reason: FinishReason | None = None, *, first: bool = False, with_usage: bool
    ) -> dict:
        if self.kind == "chat":
            delta: dict = {"role": "assistant", "content": text or ""} if first else {}
            if not first and text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason(reason)}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason(reason)}
        body = {**self._envelope(True), "choices": [choice]}
        if with_usage:
            body["usage"] = None  # OpenAI: null in every chunk but the last when include_usage is set
        return body

    def usage_chunk(self, usage_: dict) -> dict:
        return {**self._envelope(True), "choices": [], "usage": usage_}
