"""The JSON schemas the grammar is built from: objects closed unless the schema says additionalProperties, integers
bounded, in schemas alone and inlined in Lark grammars; the grammar engine then refuses undeclared properties."""

from __future__ import annotations

import copy
import json

import pytest

from engine.core.schemas import SAFE_INTEGERS, decoding_schema, lark_with_schemas
from engine.types import StructuredOutput

CLOSED = {"additionalProperties": False}


def test_every_declared_object_is_closed_nested_ones_and_those_in_defs_too() -> None:
    schema = {
        "type": "object",
        "properties": {
            "person": {"type": "object", "properties": {"name": {"type": "string"}}},
            "pets": {"type": "array", "items": {"$ref": "#/$defs/Pet"}},
            "pair": {"type": "array", "prefixItems": [{"type": "object", "properties": {"x": {"type": "number"}}}]},
            "maybe": {"type": ["object", "null"], "properties": {"y": {"type": "string"}}},
            "untyped": {"properties": {"z": {"type": "string"}}},  # properties alone make it an object schema
        },
        "$defs": {"Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}}},
        "definitions": {"Old": {"type": "object", "properties": {}}},  # draft 7's name for $defs
    }
    original = copy.deepcopy(schema)
    out = decoding_schema(schema)
    assert out["additionalProperties"] is False
    properties = out["properties"]
    for name in ("person", "maybe", "untyped"):
        assert properties[name]["additionalProperties"] is False, name
    assert properties["pair"]["prefixItems"][0]["additionalProperties"] is False
    assert properties["pets"]["items"] == {"$ref": "#/$defs/Pet"}  # a bare reference: its target is closed
    assert out["$defs"]["Pet"]["additionalProperties"] is False
    assert out["definitions"]["Old"] == {"type": "object", "properties": {}, **CLOSED}
    assert schema == original  # the caller's schema is not changed


def test_a_schema_that_says_additional_properties_keeps_what_it_says() -> None:
    schema = {
        "type": "object",
        "properties": {
            "free": {"type": "object", "additionalProperties": True},
            "counts": {"type": "object", "additionalProperties": {"type": "integer", "maximum": 9}},
            "tags": {"type": "object", "additionalProperties": {"type": "object", "properties": {"a": {}}}},
            "strict": {"type": "object", "properties": {"b": {}}, "additionalProperties": False},
            "evaluated": {"type": "object", "properties": {"c": {}}, "unevaluatedProperties": True},
        },
        "additionalProperties": True,
    }
    out = decoding_schema(schema)
    assert out["additionalProperties"] is True
    properties = out["properties"]
    assert properties["free"] == {"type": "object", "additionalProperties": True}
    assert properties["counts"]["additionalProperties"] == {"type": "integer", "maximum": 9}
    # the schema for the other properties is kept, and objects inside it are closed in turn
    assert properties["tags"]["additionalProperties"] == {"type": "object", "properties": {"a": {}}, **CLOSED}
    assert properties["strict"]["additionalProperties"] is False
    assert "additionalProperties" not in properties["evaluated"]


def test_any_of_branches_are_closed_unless_they_add_to_an_object_with_properties() -> None:
    union = {"anyOf": [{"type": "object", "properties": {"cat": {}}}, {"type": "object", "properties": {"dog": {}}},
                       {"type": "null"}]}  # fmt: skip
    out = decoding_schema(union)
    assert [branch.get("additionalProperties") for branch in out["anyOf"]] == [False, False, None]
    # branches that say which of the parent's properties are required: closing them would forbid those properties
    either = {"type": "object", "properties": {"a": {}, "b": {}},
              "oneOf": [{"type": "object", "required": ["a"]}, {"type": "object", "required": ["b"]}]}  # fmt: skip
    out = decoding_schema(either)
    assert out["additionalProperties"] is False
    assert all("additionalProperties" not in branch for branch in out["oneOf"])
    # composed shapes stay open: allOf's parts, and a $ref beside its own keys
    composed = {"allOf": [{"$ref": "#/$defs/A"}, {"type": "object", "properties": {"b": {}}}],
                "$defs": {"A": {"type": "object", "properties": {"a": {}}}}}  # fmt: skip
    out = decoding_schema(composed)
    assert "additionalProperties" not in out and "additionalProperties" not in out["allOf"][1]
    assert out["$defs"]["A"]["additionalProperties"] is False
    extended = {"$ref": "#/$defs/A", "type": "object", "properties": {"b": {}}}
    assert "additionalProperties" not in decoding_schema(extended)


def test_data_keywords_are_not_schemas_and_stay_as_they_are() -> None:
    data = {"type": "object", "properties": {"a": {}}}
    schema = {"type": "object", "properties": {"x": {"const": data, "default": data, "enum": [data]}},
              "examples": [data]}  # fmt: skip
    out = decoding_schema(schema)
    assert out["properties"]["x"] == {"const": data, "default": data, "enum": [data]}
    assert out["examples"] == [data]
    # a property named like a keyword is a property, not a keyword
    named = {"type": "object", "properties": {"properties": {"type": "string"}, "type": {"type": "integer"}}}
    out = decoding_schema(named)
    assert set(out["properties"]) == {"properties", "type"} and out["properties"]["type"]["maximum"] == SAFE_INTEGERS[1]


def test_unbounded_integers_get_the_safe_integer_range_and_bounded_ones_keep_theirs() -> None:
    properties = {
        "free": {"type": "integer"},
        "nullable": {"type": ["integer", "null"]},
        "small": {"type": "integer", "minimum": 0},
        "items": {"type": "array", "items": {"type": "integer"}},
        "text": {"type": "string"},
    }
    schema = {"type": "object", "properties": properties}
    bounded = decoding_schema(schema, close_objects=False)["properties"]
    low, high = SAFE_INTEGERS
    assert (bounded["free"]["minimum"], bounded["free"]["maximum"]) == (low, high) == (-(2**53) + 1, 2**53 - 1)
    assert bounded["nullable"]["maximum"] == high and bounded["items"]["items"]["minimum"] == low
    assert bounded["small"] == {"type": "integer", "minimum": 0} and bounded["text"] == {"type": "string"}
    assert schema["properties"]["free"] == {"type": "integer"}  # the caller's schema is not changed
    assert "additionalProperties" not in decoding_schema(schema, close_objects=False)  # open objects asked for


def test_schemas_inlined_in_a_lark_grammar_are_rewritten_and_nothing_else_is() -> None:
    schema = {"type": "object", "properties": {"zone": {"type": "string"}}}
    lark = (
        '// a comment with %json {"type": "object"} in it\n'
        'start: "%json {\\"a\\": 1}" call /%json[ ]\\/{}/ "\\n"\n'
        f"call: %json {json.dumps(schema)}  # and %json {{}} here\n"
        'other: %json\n   {"type": "integer"}\n'
    )
    out = lark_with_schemas(lark, decoding_schema)
    closed = json.dumps({**schema, **CLOSED})
    bounded = json.dumps({"type": "integer", "minimum": SAFE_INTEGERS[0], "maximum": SAFE_INTEGERS[1]})
    expected = lark.replace(f"%json {json.dumps(schema)}", f"%json {closed}")
    expected = expected.replace('%json\n   {"type": "integer"}', f"%json {bounded}")
    assert out == expected
    assert lark_with_schemas("start: %json nonsense", decoding_schema) == "start: %json nonsense"


TIME_SCHEMA = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}}, "required": ["zone"]}


def _accepts(engine, structured: StructuredOutput, text: str) -> bool:
    """Whether the engine's grammar for `structured` lets a reply spell out `text`, token by token."""
    matcher = engine.grammars.matcher(structured)
    for token in engine.tokenizer.encode(text, add_special_tokens=False):
        if not bool(matcher.allowed()[token]):
            return False
        matcher.consume(token)
    return True


@pytest.mark.parametrize("open_objects", [False, True])
def test_the_grammar_refuses_undeclared_properties_unless_open_objects_are_asked_for(make_engine, open_objects):
    from engine.core.tools import call_grammar

    engine = make_engine(open_schema_objects=open_objects)
    schema = StructuredOutput("json_schema", json.dumps(TIME_SCHEMA))
    tool = {"type": "function", "function": {"name": "get_time", "parameters": TIME_SCHEMA}}
    forced = call_grammar([tool], only="get_time")
    assert _accepts(engine, schema, '{"zone": "Paris"}')
    assert _accepts(engine, forced, '<tool_call>[\n{"name": "get_time", "arguments": {"zone": "Paris"}}\n]</tool_call>')
    invented = '{"zone": "Europe", "item": "weather"}'
    assert _accepts(engine, schema, invented) is open_objects
    call = f'<tool_call>[\n{{"name": "get_time", "arguments": {invented}}}\n]</tool_call>'
    assert _accepts(engine, forced, call) is open_objects
    # any JSON object stays any JSON object
    assert _accepts(engine, StructuredOutput("json_object"), invented)


def test_serve_closes_objects_unless_told_to_open_them() -> None:
    from app.cli.main import build_parser
    from app.cli.serve import serve_options_from

    parser = build_parser()
    assert serve_options_from(parser.parse_args(["serve"])).config.open_schema_objects is False
    assert serve_options_from(parser.parse_args(["serve", "--open-schema-objects"])).config.open_schema_objects
