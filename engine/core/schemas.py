"""JSON schemas as the engine decodes them: objects closed unless the schema says `additionalProperties`, integers
bounded to JSON's safe range, in schemas given alone and in those inlined in Lark grammars (`%json {...}`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

# An integer without bounds lets a small model write digits until max_tokens (seen on the embedded model at
# temperature 0.7: `[20181227201865, 2018122720310122...`). Unbounded integers get JSON's interoperable range
# (RFC 8259 section 6; JavaScript's safe integers, what a browser or Node client reads exactly): at most 16 digits.
# (llguidance cannot build int64's full range as a regex.)
SAFE_INTEGERS = (-(2**53) + 1, 2**53 - 1)
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")

# Where a schema holds other schemas (JSON Schema 2020-12, and draft 7's names): everything else (const, enum,
# default, examples...) is data and stays as it is, even when it looks like a schema.
_ONE = ("additionalProperties", "items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties")  # fmt: skip
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPENNESS = ("additionalProperties", "unevaluatedProperties")


def decoding_schema(schema: object, close_objects: bool = True) -> object:
    """The schema the grammar is built from: integers without bounds get SAFE_INTEGERS; with close_objects, every
    object schema that does not say `additionalProperties` gets `additionalProperties: false`, as vLLM's default
    grammar backend (xgrammar) decodes them: an API's JSON Schema generators (pydantic, zod, OpenAI's function
    schemas) leave it out, and a model that invents arguments breaks the function it calls. Objects whose shape is
    composed (allOf, a $ref beside their own keys, the branches of an anyOf/oneOf under an object with properties)
    are left open: closing one part would forbid the properties the other part declares. The caller's schema is not
    changed."""
    return _rewrite(schema, close_objects, closable=True)


def _rewrite(schema: object, close: bool, closable: bool) -> object:
    if not isinstance(schema, dict):
        return schema  # true/false schemas
    out = dict(schema)
    shaped = "properties" in schema or "patternProperties" in schema
    for key, value in schema.items():
        if key in _MAPS and isinstance(value, dict):
            out[key] = {name: _rewrite(sub, close, closable=True) for name, sub in value.items()}
        elif key in _LISTS and isinstance(value, list):
            branch_closable = key != "allOf" and not (key in ("anyOf", "oneOf") and shaped)
            out[key] = [_rewrite(sub, close, closable=branch_closable if key != "prefixItems" else True)
                        for sub in value]  # fmt: skip
        elif key in _ONE and isinstance(value, dict):
            out[key] = _rewrite(value, close, closable=True)
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if "integer" in kinds and not any(bound in schema for bound in _BOUNDS):
        out["minimum"], out["maximum"] = SAFE_INTEGERS
    is_object = "object" in kinds or shaped
    composed = "allOf" in schema or "$ref" in schema
    if close and closable and is_object and not composed and not any(key in schema for key in _OPENNESS):
        out["additionalProperties"] = False
    return out


# a Lark grammar's string literals, regexes and comments: a `%json` inside them is text, not a schema
_LARK_SPECIAL = re.compile(r'"|//|/|#|%json\b')


def lark_with_schemas(lark: str, rewrite: Callable[[object], object]) -> str:
    """The Lark grammar with each inline `%json {...}` schema replaced by rewrite(schema)."""
    decoder = json.JSONDecoder()
    out: list[str] = []
    at = 0
    while (found := _LARK_SPECIAL.search(lark, at)) is not None:
        start, token = found.start(), found.group()
        out.append(lark[at:start])
        if token == "%json":
            body = start + len(token)
            while body < len(lark) and lark[body].isspace():
                body += 1
            try:
                schema, end = decoder.raw_decode(lark, body)
            except ValueError:  # not a JSON value: llguidance will say what is wrong with the grammar
                out.append(token)
                at = found.end()
                continue
            out.append(f"%json {json.dumps(rewrite(schema), ensure_ascii=False)}")
            at = end
            continue
        # a comment runs to the line's end; a "string" or a /regex/ to its closing delimiter that is not escaped
        end = lark.find("\n", start) if token in ("//", "#") else _closing(lark, start + 1, token)
        end = len(lark) if end < 0 else end + 1
        out.append(lark[start:end])
        at = end
    out.append(lark[at:])
    return "".join(out)


def _closing(text: str, at: int, delimiter: str) -> int:
    while at < len(text):
        if text[at] == "\\":
            at += 2
            continue
        if text[at] == delimiter or text[at] == "\n":
            return at
        at += 1
    return -1
