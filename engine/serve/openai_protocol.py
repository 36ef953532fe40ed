"""The OpenAI wire format's requests: bodies checked into engine inputs, and errors in OpenAI's shape."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from engine.errors import InvalidRequestError
from engine.serve.completions_wire import RequestKind
from engine.serve.features import parse_features
from engine.serve.limits import ServeLimits
from engine.types import (
    PENALTY_LIMIT,
    REPETITION_PENALTY_MAX,
    REPETITION_PENALTY_MIN,
    SEED_MAX,
    SEED_MIN,
    SamplingParams,
    validate_messages,
)

DEFAULT_LIMITS = ServeLimits()
#: top_k at or above the vocabulary means "off"; beyond this it is a client bug, not a choice
TOP_K_MAX = 2**31 - 1


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
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass
class GenerationRequest:
    """One checked request: what to tokenize, how to sample, how to answer."""

    kind: RequestKind
    model: str
    messages: list[dict] | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    #: the field that set max tokens ("max_tokens" or "max_completion_tokens"); None when the client gave none: the
    #: server then lets the reply run to the end of the context
    max_tokens_param: str | None = None
    stream: bool = False
    include_usage: bool = False
    #: tools shown to the model (None: none, or tool_choice "none"); the reply's calls are parsed out of its text
    tools: list[dict] | None = None
    tokens_as_ids: bool = False  # logprobs name tokens "token_id:N" (vLLM's return_tokens_as_token_ids)
    structured_param: str | None = None  # the field that constrained the output (what a grammar's error names)


# Fields we do not implement: refused with a clear message rather than silently ignored, when set to
# anything but their "off" value.
_UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
}
_HINTS = {
    "functions": "; use 'tools' instead (the deprecated 'functions' is not supported)",
    "function_call": "; use 'tool_choice' instead",
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


def _stop_strings(body: dict, limits: ServeLimits) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    if len(stop) > limits.max_stop:
        raise bad_request(f"'stop' takes at most {limits.max_stop} strings, not {len(stop)}", "stop")
    if any(not s for s in stop):
        raise bad_request("'stop' strings must not be empty", "stop")
    if any(len(s) > limits.max_stop_chars for s in stop):
        raise bad_request(f"'stop' strings must be at most {limits.max_stop_chars} characters long", "stop")
    return tuple(stop)


def _refuse_unsupported(body: dict) -> None:
    for name, off_values in _UNSUPPORTED.items():
        if name in body and body[name] not in off_values:
            raise bad_request(f"'{name}' is not supported by this server{_HINTS.get(name, '')}", name)


def _streaming(body: dict) -> tuple[bool, bool]:
    """'stream' and whether the last chunk carries the usage (stream_options.include_usage)."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false", "stream")
    stream_options = body.get("stream_options")
    if stream_options is None:
        return stream, False
    if not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if not isinstance(stream_options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    return stream, bool(stream_options.get("include_usage", False))


def _max_tokens(body: dict) -> tuple[int | None, str | None]:
    """The reply's token limit and the field that set it (max_completion_tokens wins, as in OpenAI's API)."""
    max_tokens, param = None, None
    for name in ("max_completion_tokens", "max_tokens"):
        value = _number(body, name, integer=True)
        if value is not None:
            if value < 1:
                raise bad_request(f"'{name}' must be at least 1, not {value}", name)
            if max_tokens is None:
                max_tokens, param = value, name
    return max_tokens, param


def _seed(body: dict) -> int | None:
    seed = _number(body, "seed", integer=True)
    if seed is not None and not SEED_MIN <= seed <= SEED_MAX:
        raise bad_request(f"'seed' must be an integer from {SEED_MIN} to {SEED_MAX}", "seed")
    return seed


def _sampling_params(body: dict, max_tokens: int | None, limits: ServeLimits) -> SamplingParams:
    temperature = _number(body, "temperature", default=1.0)
    _check_range("temperature", temperature, 0.0, 2.0)
    top_p = _number(body, "top_p", default=1.0)
    _check_range("top_p", top_p, 0.0, 1.0, low_open=True)
    # vLLM's extra sampling fields, so another studio (or a vLLM-aware client) can pass the full settings
    top_k = _number(body, "top_k", integer=True, default=0)
    if top_k == -1:  # vLLM's spelling of "off"
        top_k = 0
    _check_range("top_k", top_k, 0, TOP_K_MAX)
    repetition_penalty = _number(body, "repetition_penalty", default=1.0)
    _check_range("repetition_penalty", repetition_penalty, REPETITION_PENALTY_MIN, REPETITION_PENALTY_MAX)
    penalties = {}
    for name in ("presence_penalty", "frequency_penalty"):  # OpenAI's: over the reply's own tokens, -2 to 2
        penalties[name] = float(_number(body, name, default=0.0))
        _check_range(name, penalties[name], -PENALTY_LIMIT, PENALTY_LIMIT)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad_request("'ignore_eos' must be true or false", "ignore_eos")
    min_tokens = _number(body, "min_tokens", integer=True, default=0)  # vLLM's: EOS is banned until then
    if min_tokens < 0 or (max_tokens is not None and min_tokens > max_tokens):
        raise bad_request(f"'min_tokens' must be between 0 and max_tokens, not {min_tokens}", "min_tokens")
    return SamplingParams(
        max_tokens=max_tokens or max(1, min_tokens),
        min_tokens=min_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=top_k,
        min_p=float(_number(body, "min_p", default=0.0)),
        repetition_penalty=float(repetition_penalty),
        **penalties,
        seed=_seed(body),
        stop=_stop_strings(body, limits),
        ignore_eos=ignore_eos,
    )


def _common(body: object, kind: RequestKind, limits: ServeLimits) -> GenerationRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("you must provide a model parameter (see GET /v1/models)", "model")
    _refuse_unsupported(body)
    n = _number(body, "n", integer=True, default=1)
    if n != 1:
        raise bad_request(f"'n' must be 1: this server generates one choice per request, not {n}", "n")
    stream, include_usage = _streaming(body)
    max_tokens, max_tokens_param = _max_tokens(body)
    try:
        features = parse_features(body, chat=kind is RequestKind.CHAT)
    except InvalidRequestError as exc:
        raise bad_request(str(exc), exc.param) from None
    params = replace(
        _sampling_params(body, max_tokens, limits),
        structured=features.structured,
        logprobs=features.logprobs,
        logit_bias=features.logit_bias,
        stop_token_ids=features.stop_token_ids,
    )
    try:
        params.validate()  # once, here: the engine's check of these params then finds them checked
    except InvalidRequestError as exc:
        raise bad_request(str(exc)) from None
    return GenerationRequest(
        kind=kind,
        model=model,
        params=params,
        max_tokens_param=max_tokens_param,
        stream=stream,
        include_usage=include_usage,
        tools=features.tools,
        tokens_as_ids=features.tokens_as_ids,
        structured_param=features.structured_param,
    )


def _check_prompt_size(chars: int, limits: ServeLimits, param: str) -> None:
    if chars > limits.max_prompt_chars:
        raise bad_request(
            f"the {param} hold {chars} characters; this server accepts at most {limits.max_prompt_chars}", param
        )


def parse_chat_request(body: object, limits: ServeLimits = DEFAULT_LIMITS) -> GenerationRequest:
    request = _common(body, RequestKind.CHAT, limits)
    assert isinstance(body, dict)
    if "messages" not in body:
        raise bad_request("'messages' is required: a list of {role, content} objects", "messages")
    messages = body["messages"]
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise bad_request(f"at most {limits.max_messages} messages are accepted, not {len(messages)}", "messages")
    try:
        request.messages = validate_messages(messages)
    except InvalidRequestError as exc:
        raise bad_request(str(exc), "messages") from None
    _check_prompt_size(sum(len(m["content"]) for m in request.messages), limits, "messages")
    return request


def parse_completion_request(body: object, limits: ServeLimits = DEFAULT_LIMITS) -> GenerationRequest:
    request = _common(body, RequestKind.COMPLETION, limits)
    assert isinstance(body, dict)
    prompt = body.get("prompt")
    # the OpenAI API also takes a batch of prompts; one prompt per request here, like n = 1
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' must not be empty", "prompt")
        _check_prompt_size(len(prompt), limits, "prompt")
        request.prompt = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        request.prompt_ids = list(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("this server takes one prompt per request; send a batch as separate requests", "prompt")
    else:
        raise bad_request("'prompt' is required: a string or a list of token ids", "prompt")
    return request
