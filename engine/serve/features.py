"""The OpenAI API's features beyond plain sampling, read from a request body: structured output (response_format,
vLLM's structured_outputs and guided_* extras), tools and tool_choice, logprobs, logit_bias, stop_token_ids."""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.core.tools import call_grammar, check_tools
from engine.errors import InvalidRequestError
from engine.types import MAX_TOP_LOGPROBS, StructuredKind, StructuredOutput

MAX_COMPLETION_LOGPROBS = 5  # the completions API's own limit
VLLM_KINDS = {
    "json": StructuredKind.JSON_SCHEMA,
    "regex": StructuredKind.REGEX,
    "choice": StructuredKind.CHOICE,
    "grammar": StructuredKind.GRAMMAR,
}


@dataclass
class Features:
    structured: StructuredOutput | None = None
    structured_param: str | None = None  # the field that asked for it: what an error in its grammar names
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    tools: list[dict] | None = None  # shown to the model; None: no tools (or tool_choice "none")
    tool_choice: str = "auto"  # auto, required, or a function's name
    parallel_tool_calls: bool = False
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N"


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param)  # the API answers with the field at fault


def _json_text(value: object, param: str) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _bad(f"'{param}' must be a JSON schema", param) from None
    if not isinstance(value, dict):
        raise _bad(f"'{param}' must be a JSON schema object", param)
    # one spelling per schema (compiled once, cached by it), in the client's key order: properties are written in the
    # order the schema declares them, as OpenAI does (sorting them changed the replies and their lengths)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _response_format(value: object) -> StructuredOutput | None:
    if value in (None, {}):
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(StructuredKind.JSON_OBJECT)
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            raise _bad("'response_format.json_schema.schema' is required", "response_format")
        return StructuredOutput(StructuredKind.JSON_SCHEMA, _json_text(schema, "response_format"))
    raise _bad("'response_format.type' must be text, json_object or json_schema", "response_format")


def _structured_field(body: dict) -> str:
    """The field a vLLM-style constraint came from: its guided_* field, else structured_outputs."""
    fields = (f"guided_{name}" for name in VLLM_KINDS)
    return next((field for field in fields if body.get(field) is not None), "structured_outputs")


def _vllm_structured(body: dict) -> StructuredOutput | None:
    """vLLM's structured_outputs {json|regex|choice|grammar|json_object}, and its older guided_* fields."""
    extras = body.get("structured_outputs") or {}
    if not isinstance(extras, dict):
        raise _bad("'structured_outputs' must be an object", "structured_outputs")
    for name in VLLM_KINDS:
        if f"guided_{name}" in body:
            extras = {**extras, name: body[f"guided_{name}"]}
    if extras.get("json_object"):
        return StructuredOutput(StructuredKind.JSON_OBJECT)
    found = [(name, extras[name]) for name in VLLM_KINDS if extras.get(name) is not None]
    if len(found) > 1:
        raise _bad("give one of json, regex, choice or grammar", "structured_outputs")
    if not found:
        return None
    name, value = found[0]
    if name == "json":
        return StructuredOutput(StructuredKind.JSON_SCHEMA, _json_text(value, "structured_outputs"))
    if name == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise _bad("'choice' must be a non-empty list of strings", "structured_outputs")
        return StructuredOutput(StructuredKind.CHOICE, json.dumps(value))
    if not isinstance(value, str) or not value:
        raise _bad(f"'{name}' must be a non-empty string", "structured_outputs")
    return StructuredOutput(VLLM_KINDS[name], value)


def _logprobs(body: dict, chat: bool) -> int | None:
    value = body.get("logprobs")
    if chat:
        if value in (None, False):
            return None
        if value is not True:
            raise _bad("'logprobs' must be true or false", "logprobs")
        top = body.get("top_logprobs", 0)
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise _bad(f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}", "top_logprobs")
        return top
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COMPLETION_LOGPROBS:
        raise _bad(f"'logprobs' must be an integer from 0 to {MAX_COMPLETION_LOGPROBS}", "logprobs")
    return value


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    if value in (None, {}):
        return ()
    if not isinstance(value, dict) or len(value) > 1024:
        raise _bad("'logit_bias' must map at most 1024 token ids to numbers", "logit_bias")
    bias = []
    for token, amount in value.items():
        try:
            token_id = int(token)
        except (TypeError, ValueError):
            raise _bad(f"'logit_bias' keys must be token ids, not {token!r}", "logit_bias") from None
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not -100 <= amount <= 100:
            raise _bad("'logit_bias' values must be numbers from -100 to 100", "logit_bias")
        bias.append((token_id, float(amount)))
    return tuple(bias)


def _stop_token_ids(value: object) -> tuple[int, ...]:
    if value in (None, []):
        return ()
    if (
        not isinstance(value, list)
        or len(value) > 256
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        raise _bad("'stop_token_ids' must be a list of at most 256 token ids", "stop_token_ids")
    return tuple(value)


def _tool_choice(value: object, tools: list[dict]) -> str:
    if value is None:
        return "auto"
    if value in ("auto", "none", "required"):
        return str(value)
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
        raise _bad(
            "'tool_choice' must be auto, none, required or {type: function, function: {name}} of a tool", "tool_choice"
        )
    return name


def parse_features(body: dict, chat: bool) -> Features:
    """The features a request body asks for, checked; raises InvalidRequestError (with its .param) on a bad one."""
    features = Features(
        logprobs=_logprobs(body, chat),
        logit_bias=_logit_bias(body.get("logit_bias")),
        stop_token_ids=_stop_token_ids(body.get("stop_token_ids")),
        tokens_as_ids=body.get("return_tokens_as_token_ids") is True,
    )
    response_format, vllm = _response_format(body.get("response_format")), _vllm_structured(body)
    if response_format and vllm:
        raise _bad("give either response_format or structured_outputs, not both", "response_format")
    features.structured = response_format or vllm
    if features.structured is not None:
        features.structured_param = "response_format" if response_format else _structured_field(body)
    tools = body.get("tools")
    if tools not in (None, []):
        if not chat:
            raise _bad("'tools' are for chat completions", "tools")
        try:
            checked = check_tools(tools)
        except InvalidRequestError as exc:
            raise _bad(str(exc), "tools") from None
        features.tool_choice = _tool_choice(body.get("tool_choice"), checked)
        features.parallel_tool_calls = body.get("parallel_tool_calls") is True
        if features.tool_choice != "none":
            features.tools = checked
        if features.tool_choice not in ("auto", "none"):
            if features.structured is not None:
                raise _bad("a required tool call and a response_format cannot both constrain the reply", "tool_choice")
            only = None if features.tool_choice == "required" else features.tool_choice
            features.structured = call_grammar(checked, only, features.parallel_tool_calls)
            features.structured_param = "tools"
    elif body.get("tool_choice") not in (None, "none", "auto"):
        raise _bad("'tool_choice' needs 'tools'", "tool_choice")
    return features
