"""The OpenAI wire format: request bodies checked into engine inputs, and the response and stream-chunk objects."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from engine.errors import InvalidRequestError
from engine.prompts import validate_messages
from engine.request import SamplingParams


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass
class GenerationRequest:
    """One checked request: what to tokenize, how to sample, how to answer."""

    kind: str  # "chat" or "completion"
    model: str
    messages: list[dict] | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    #: False when the client gave no max tokens: the server then lets the reply run to the end of the context
    max_tokens_given: bool = False
    stream: bool = False
    include_usage: bool = False


# Fields we do not implement: refused with a clear message rather than silently ignored, when set to
# anything but their "off" value.
_UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
}
_HINTS = {
    "presence_penalty": "; use repetition_penalty instead",
    "frequency_penalty": "; use repetition_penalty instead",
}


def _number(body: dict, name: str, *, integer: bool = False, default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    # bool is an int in Python, but `"max_tokens": true` is a client bug worth naming
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise bad_request(f"'{name}' must be {kind}, not {value!r}", name)
    if not integer and not math.isfinite(value):
        raise bad_request(f"'{name}' must be a finite number", name)
    return value


def _check_range(name: str, value: float, low: float, high: float, *, low_open: bool = False) -> None:
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise bad_request(f"'{name}' must be in {bracket}{low:g}, {high:g}], not {value!r}", name)


def _stop_strings(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    if any(not s for s in stop):
        raise bad_request("'stop' strings must not be empty", "stop")
    return tuple(stop)


def _refuse_unsupported(body: dict) -> None:
    for name, off_values in _UNSUPPORTED.items():
        if name in body and body[name] not in off_values:
            raise bad_request(f"'{name}' is not supported by this server{_HINTS.get(name, '')}", name)
    response_format = body.get("response_format")
    if response_format not in (None, {}) and (
        not isinstance(response_format, dict) or response_format.get("type") != "text"
    ):
        raise bad_request("only the 'text' response_format is supported by this server", "response_format")


def _common(body: object, kind: str) -> GenerationRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("you must provide a model parameter (see GET /v1/models)", "model")
    _refuse_unsupported(body)
    n = _number(body, "n", integer=True, default=1)
    if n != 1:
        raise bad_request(f"'n' must be 1: this server generates one choice per request, not {n}", "n")

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false", "stream")
    stream_options = body.get("stream_options")
    include_usage = False
    if stream_options is not None:
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(stream_options, dict):
            raise bad_request("'stream_options' must be an object", "stream_options")
        include_usage = bool(stream_options.get("include_usage", False))

    max_tokens = None
    for name in ("max_completion_tokens", "max_tokens"):
        value = _number(body, name, integer=True)
        if value is not None:
            if value < 1:
                raise bad_request(f"'{name}' must be at least 1, not {value}", name)
            max_tokens = value if max_tokens is None else max_tokens
    temperature = _number(body, "temperature", default=1.0)
    _check_range("temperature", temperature, 0.0, 2.0)
    top_p = _number(body, "top_p", default=1.0)
    _check_range("top_p", top_p, 0.0, 1.0, low_open=True)
    seed = _number(body, "seed", integer=True)
    # vLLM's extra sampling fields, so another studio (or a vLLM-aware client) can pass the full settings
    top_k = _number(body, "top_k", integer=True, default=0)
    if top_k == -1:  # vLLM's spelling of "off"
        top_k = 0
    min_p = _number(body, "min_p", default=0.0)
    repetition_penalty = _number(body, "repetition_penalty", default=1.0)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad_request("'ignore_eos' must be true or false", "ignore_eos")

    params = SamplingParams(
        max_tokens=max_tokens or 1,
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=top_k,
        min_p=float(min_p),
        repetition_penalty=float(repetition_penalty),
        seed=seed,
        stop=_stop_strings(body),
        ignore_eos=ignore_eos,
    )
    try:
        params.validate()
    except InvalidRequestError as exc:
        raise bad_request(str(exc)) from None
    return GenerationRequest(
        kind=kind,
        model=model,
        params=params,
        max_tokens_given=max_tokens is not None,
        stream=stream,
        include_usage=include_usage,
    )


def parse_chat_request(body: object) -> GenerationRequest:
    request = _common(body, "chat")
    assert isinstance(body, dict)
    if "messages" not in body:
        raise bad_request("'messages' is required: a list of {role, content} objects", "messages")
    try:
        request.messages = validate_messages(body["messages"])
    except InvalidRequestError as exc:
        raise bad_request(str(exc), "messages") from None
    return request


def parse_completion_request(body: object) -> GenerationRequest:
    request = _common(body, "completion")
    assert isinstance(body, dict)
    prompt = body.get("prompt")
    # the OpenAI API also takes a batch of prompts; one prompt per request here, like n = 1
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' must not be empty", "prompt")
        request.prompt = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        request.prompt_ids = list(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("this server takes one prompt per request; send a batch as separate requests", "prompt")
    else:
        raise bad_request("'prompt' is required: a string or a list of token ids", "prompt")
    return request


# ---- responses ------------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def finish_reason(engine_reason: str | None) -> str | None:
    """The engine's reasons map onto OpenAI's; an aborted request only happens when the client left."""
    if engine_reason in ("stop", "length"):
        return engine_reason
    return None if engine_reason is None else "stop"


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

    def whole(self, text: str, reason: str | None, usage_: dict) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish_reason(reason)
        return {**self._envelope(False), "choices": [choice], "usage": usage_}

    def chunk(self, text: str | None, reason: str | None = None, *, first: bool = False, with_usage: bool) -> dict:
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
