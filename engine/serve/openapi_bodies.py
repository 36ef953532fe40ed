"""The request bodies the routes read, as JSON schemas for /openapi.json (the routes parse their bodies themselves,
so FastAPI cannot infer them): what client generators and API fuzzers such as schemathesis read."""

from __future__ import annotations

_NUMBER = {"type": "number"}
_STOP = {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string"}, "maxItems": 16}]}
_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_TOOL_CALL = {
    "type": "object",
    "required": ["function"],
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
        },
    },
}
MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]},
        "tool_calls": {"type": "array", "items": _TOOL_CALL},
        "tool_call_id": {"type": "string"},
        "name": {"type": "string"},
    },
}
FUNCTION_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
                "description": {"type": "string"},
                "parameters": {"type": "object"},
                "strict": {"type": "boolean"},
            },
        },
    },
}
RESPONSE_FORMAT = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]},
        "json_schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "schema": {"type": "object"}, "strict": {"type": "boolean"}},
        },
    },
}
SAMPLING = {
    "model": {"type": "string", "minLength": 1},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "n": {"const": 1},
    "seed": {"type": "integer"},
    "stop": _STOP,
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "logit_bias": {"type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
    "user": {"type": "string"},
    # vLLM's extras
    "top_k": {"type": "integer", "minimum": -1},
    "min_p": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
    "min_tokens": {"type": "integer", "minimum": 0},
    "ignore_eos": {"type": "boolean"},
    "stop_token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 256},
    "structured_outputs": {"type": "object"},
}
CHAT_BODY = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        **SAMPLING,
        "messages": {"type": "array", "items": MESSAGE, "minItems": 1, "maxItems": 1024},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        "response_format": RESPONSE_FORMAT,
        "tools": {"type": "array", "items": FUNCTION_TOOL, "minItems": 1},
        "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
        "parallel_tool_calls": {"type": "boolean"},
    },
}
COMPLETION_BODY = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        **SAMPLING,
        "prompt": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "integer"}}]},
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 5},
        "echo": {"const": False},
    },
}

_INPUT_ITEM = {
    "type": "object",
    "properties": {
        "type": {"enum": ["message", "function_call", "function_call_output"]},
        "role": {"enum": ["user", "system", "developer", "assistant"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "call_id": {"type": "string"},
        "name": {"type": "string"},
        "arguments": {"type": "string"},
        "output": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    },
}
RESPONSES_BODY = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": _INPUT_ITEM, "minItems": 1}]},
        "instructions": {"type": "string"},
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "stream": {"type": "boolean"},
        "store": {"type": "boolean"},
        "previous_response_id": {"type": "string"},
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "name"],
                "properties": {"type": {"const": "function"}, "name": {"type": "string"},
                               "parameters": {"type": "object"}},
            },
        },
        "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
        "parallel_tool_calls": {"type": "boolean"},
        "text": {"type": "object", "properties": {"format": RESPONSE_FORMAT}},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}  # fmt: skip


def request_body(schema: dict) -> dict:
    """A route's openapi_extra: its JSON request body."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
