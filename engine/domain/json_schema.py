"""Whether a JSON schema typed by the user can constrain replies: the engine's grammar compiler (llguidance) says."""

from __future__ import annotations

import json

import llguidance

_SCHEMA_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


def schema_problem(text: str) -> str | None:
    """Why a JSON schema typed by the user can't be used (one line), or None when it can: well-formed JSON, an object,
    and what the engine's grammar compiler (llguidance) accepts, at every level (an unknown type deep inside, a $ref to
    nothing)."""
    if not text.strip():
        return 'Type a JSON schema, e.g. {"type": "object", "properties": {…}}'
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    except RecursionError:
        return "Not valid JSON: nested too deeply"
    if not isinstance(schema, dict):
        return f"A schema must be a JSON object {{…}}, not {_json_kind(schema)}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for name in kinds:
        if name not in _SCHEMA_TYPES:
            return f"Unknown type {json.dumps(name)}: use one of {', '.join(_SCHEMA_TYPES)}"
    return _compiler_problem(schema)


def _compiler_problem(schema: dict) -> str | None:
    """The engine's own check: llguidance builds the grammar (no tokenizer is needed to validate it)."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        problem = llguidance.LLMatcher.validate_grammar(grammar, None)
    except (ValueError, RuntimeError, TypeError) as exc:
        problem = str(exc)
    return f"The engine can't use this schema: {problem.splitlines()[0]}" if problem else None


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "a number"
