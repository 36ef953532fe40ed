"""Tool calling below the API: the tools in the prompt, a forced call's grammar, and calls parsed back."""

from __future__ import annotations

import json

import pytest

from engine.core.tools import call_grammar, check_tools, messages_with_tools, parse_calls
from engine.errors import InvalidRequestError
from engine.types import FinishReason, SamplingParams, validate_messages
from tests.helpers import run_to_completion

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def test_a_forced_call_is_always_a_valid_call(make_engine) -> None:
    engine = make_engine()
    grammar = call_grammar([WEATHER, TIME], only="get_weather")
    requests = [
        engine.add_request([5 + i, 9, 11], SamplingParams(max_tokens=200, structured=grammar)) for i in range(4)
    ]
    run_to_completion(engine)
    for request in requests:
        assert request.finish_reason is FinishReason.STOP
        text = engine.tokenizer.decode(request.output_ids, skip_special_tokens=True)
        rest, calls = parse_calls(text)
        assert rest == "" and [c.name for c in calls] == ["get_weather"]
        arguments = json.loads(calls[0].arguments)
        assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")
        assert len(arguments["city"]) <= 12


def test_tools_are_checked() -> None:
    assert check_tools([WEATHER]) == [WEATHER]
    for bad in ([], [{"type": "function"}], [WEATHER, WEATHER], [{"type": "retrieval", "function": {"name": "x"}}]):
        with pytest.raises(InvalidRequestError):
            check_tools(bad)
    with pytest.raises(InvalidRequestError, match="not in 'tools'"):
        call_grammar([WEATHER], only="nope")


def test_a_conversation_with_calls_and_results_is_shown_as_the_model_writes_them(tiny_loaded) -> None:
    history = validate_messages(
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
        ]
    )  # fmt: skip
    messages, native = messages_with_tools(history, [WEATHER], tiny_loaded.tokenizer)
    assert not native and messages[0]["role"] == "system" and "get_weather" in messages[0]["content"]
    assert messages[2]["content"] == '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
    assert messages[3]["content"].startswith("<tool_response>") and '{"temp": 21}' in messages[3]["content"]


def test_calls_are_parsed_from_a_list_or_a_single_object_and_text_stays_text() -> None:
    rest, calls = parse_calls('Sure. <tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    assert rest == "Sure." and calls[0].name == "get_time" and calls[0].arguments == "{}"
    assert parse_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


def test_a_forced_call_whose_parameters_refer_to_their_own_defs_compiles_and_is_valid(make_engine) -> None:
    """pydantic's nested models write "$ref": "#/$defs/Address" (what instructor sends): inside the call's schema that
    pointed at the grammar's root, and compiling failed ("Pointer '/$defs/Address' does not exist")."""
    from pydantic import BaseModel, Field

    class Address(BaseModel):  # bounded: the tiny random model writes strings until it is stopped
        city: str = Field(max_length=8)
        zip_code: int = Field(ge=0, le=99999)

    class Person(BaseModel):
        name: str = Field(max_length=8)
        address: Address
        previous: list[Address] = Field(max_length=2)

    schema = Person.model_json_schema()
    person = {"type": "function", "function": {"name": "Person", "parameters": schema}}
    engine = make_engine()
    grammar = call_grammar([person, WEATHER], only="Person")
    request = engine.add_request([5, 9, 11], SamplingParams(max_tokens=300, structured=grammar, temperature=1.0,
                                                            seed=4))  # fmt: skip
    run_to_completion(engine)
    assert request.finish_reason is FinishReason.STOP, engine.tokenizer.decode(request.output_ids)
    _, calls = parse_calls(engine.tokenizer.decode(request.output_ids, skip_special_tokens=True))
    Person.model_validate_json(calls[0].arguments)
