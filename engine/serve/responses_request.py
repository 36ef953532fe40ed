"""The Responses API's request (POST /v1/responses), read into the chat request the engine serves: input as text or
items, instructions, function tools, text.format, previous_response_id; what a local text model cannot do (built-in
tools, images, files, background runs, reasoning) is a 400 that names it."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.serve.limits import ServeLimits
from engine.serve.openai_protocol import ApiError, GenerationRequest, bad_request, parse_chat_request
from engine.serve.response_store import ResponseStore

#: fields read here and what they become in the chat request (errors are answered under the Responses name)
RENAMED = {"max_output_tokens": "max_tokens", "text.format": "response_format", "input": "messages"}
#: fields passed through as they are (OpenAI's, and vLLM's sampling extras)
PASSED = ("model", "temperature", "top_p", "parallel_tool_calls", "stream", "seed", "top_k", "min_p",
          "repetition_penalty", "presence_penalty", "frequency_penalty", "min_tokens", "ignore_eos", "logit_bias",
          "stop", "stop_token_ids")  # fmt: skip
#: accepted and without effect here: bookkeeping for OpenAI's platform
IGNORED = ("user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "service_tier", "stream_options")
#: what a local text model cannot do, refused when set to anything but "off"
_OFF: dict[str, tuple[object, ...]] = {
    "background": (None, False),
    "conversation": (None,),
    "prompt": (None,),
    "include": (None, []),
    "max_tool_calls": (None,),
    "top_logprobs": (None, 0),
    "truncation": (None, "disabled"),
}
_HINTS = {
    "background": "; responses run while the request is open (use stream for long ones)",
    "conversation": "; use previous_response_id",
    "prompt": "; send the instructions and input themselves",
    "truncation": "; only 'disabled' (a prompt over the context is a 400)",
    "reasoning": "; the served model does not reason in separate steps",
}
_TEXT_PARTS = {"input_text", "output_text", "text"}


@dataclass
class ResponsesRequest:
    """One checked Responses request: the chat request to run, and what the Response object echoes."""

    gen: GenerationRequest
    conversation: list[dict]  # previous response's conversation + this input, as chat messages (no instructions)
    instructions: str | None = None
    tools: list[dict] = field(default_factory=list)  # as the client sent them (Responses' flat function tools)
    tool_choice: object = "auto"
    text_format: dict = field(default_factory=lambda: {"type": "text"})
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = False  # several calls in one forced reply (as in chat requests, off unless asked)


def _refuse_unsupported(body: dict) -> None:
    for name, off in _OFF.items():
        if body.get(name) not in off:
            raise bad_request(f"'{name}' is not supported by this server{_HINTS.get(name, '')}", name)
    reasoning = body.get("reasoning")
    if reasoning not in (None, {}) and not (isinstance(reasoning, dict) and not any(reasoning.values())):
        raise bad_request(f"'reasoning' is not supported by this server{_HINTS['reasoning']}", "reasoning")


def _text_of(content: object, where: str) -> str:
    """A message's content: a string, or parts of text (input_text, output_text); other parts are refused by name."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: 'content' must be a string or a list of content parts", "input")
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            named = f"of type {kind!r}" if isinstance(kind, str) else "without a type"
            raise bad_request(
                f"{where}: content part {index} is {named}; this model reads text only (input_text parts)", "input"
            )
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{where}: content part {index} has no 'text'", "input")
        texts.append(part["text"])
    return "".join(texts)


def input_messages(value: object) -> list[dict]:
    """Responses input (a string, or message, function_call and function_call_output items) as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty list of items", "input")
    messages: list[dict] = []
    for number, item in enumerate(value):
        where = f"input item {number}"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{where} has unknown role {role!r}", "input")
            messages.append({"role": role, "content": _text_of(item.get("content"), where)})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise bad_request(f"{where}: a function_call needs call_id, name and arguments (strings)", "input")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
                last["tool_calls"].append(call)  # calls made in one turn go back as one assistant message
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}: a function_call_output needs the call_id it answers", "input")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": _text_of(output, where)})
        else:
            raise bad_request(
                f"{where} is of type {kind!r}; this server takes message, function_call and function_call_output items",
                "input",
            )
    return messages


def chat_tools(tools: object) -> list[dict]:
    """Responses' function tools ({type, name, parameters}) as chat tools; built-in tools are refused by name."""
    if tools in (None, []):
        return []
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of function tools", "tools")
    out = []
    for number, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise bad_request(
                f"tool {number} is the built-in tool {kind!r}, which this server does not run; only function tools "
                "({type: function, name, parameters}) are supported",
                "tools",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: object) -> object:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise bad_request(f"'tool_choice' {kind!r} is not supported; use auto, none, required or a function", "tool_choice")


def text_format(text: object) -> tuple[dict, dict | None]:
    """text.format as (its echo in the Response, the chat response_format)."""
    if text is None:
        return {"type": "text"}, None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return {"type": "text"}, None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return fmt, None
    if kind == "json_object":
        return fmt, {"type": "json_object"}
    if kind == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return fmt, {"type": "json_schema", "json_schema": spec}
    raise bad_request("'text.format.type' must be text, json_object or json_schema", "text.format")


def _responses_error(error: ApiError) -> ApiError:
    """A chat request's error, in the Responses request's names."""
    message, param = error.message, error.param
    for theirs, ours in RENAMED.items():
        message = message.replace(f"'{ours}'", f"'{theirs}'")
        if param == ours:
            param = theirs
    return ApiError(error.status, message, type=error.type, param=param, code=error.code, headers=error.headers)


def parse_responses_request(body: object, store: ResponseStore, limits: ServeLimits) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _refuse_unsupported(body)
    if "input" not in body:
        raise bad_request("'input' is required: a string or a list of items", "input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string", "instructions")
    previous_id = body.get("previous_response_id")
    history: list[dict] = []
    if previous_id is not None:
        previous = store.get(previous_id) if isinstance(previous_id, str) else None
        if previous is None:
            raise bad_request(
                f"previous response {previous_id!r} not found: this server keeps responses (created with store) "
                "while it runs, the most recent ones first",
                "previous_response_id",
                code="previous_response_not_found",
            )
        history = [dict(m) for m in previous.messages]
    conversation = history + input_messages(body["input"])
    echo_format, response_format = text_format(body.get("text"))
    chat: dict = {k: body[k] for k in PASSED if k in body}
    chat["messages"] = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if response_format is not None:
        chat["response_format"] = response_format
    tools = chat_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        chat["tool_choice"] = chat_tool_choice(body.get("tool_choice"))
    elif body.get("tool_choice") not in (None, "auto", "none"):
        raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
    try:
        gen = parse_chat_request(chat, limits)
    except ApiError as error:
        raise _responses_error(error) from None
    if gen.max_tokens_param is not None:
        gen.max_tokens_param = "max_output_tokens"
    store_it = body.get("store", True)
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad_request("'metadata' must be an object of strings", "metadata")
    return ResponsesRequest(
        gen=gen,
        conversation=conversation,
        instructions=instructions,
        tools=list(body.get("tools") or []),
        tool_choice=body.get("tool_choice") or "auto",
        text_format=echo_format,
        previous_response_id=previous_id,
        store=store_it is not False,
        metadata=metadata,
        max_output_tokens=body.get("max_output_tokens"),
        parallel_tool_calls=body.get("parallel_tool_calls") is True,
    )
