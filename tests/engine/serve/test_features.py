"""The OpenAI features read from request bodies, and tool calls split out of a streaming reply."""

from __future__ import annotations

import json
import random

import pytest

from engine.core.tools import parse_calls
from engine.errors import InvalidRequestError
from engine.serve.features import parse_features
from engine.serve.tool_stream import ToolCallStream

TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]


def test_response_format_and_vllm_extras_become_structured_output() -> None:
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    parsed = parse_features(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}, True
    )
    assert parsed.structured.kind == "json_schema" and json.loads(parsed.structured.spec) == schema
    # the properties keep the client's order: the model writes them in it, as OpenAI's API does (b before a)
    assert list(json.loads(parsed.structured.spec)["properties"]) == ["b", "a"]
    assert parse_features({"response_format": {"type": "json_object"}}, True).structured.kind == "json_object"
    assert parse_features({"response_format": {"type": "text"}}, True).structured is None
    assert parse_features({"structured_outputs": {"regex": "[0-9]+"}}, True).structured.spec == "[0-9]+"
    assert parse_features({"guided_choice": ["a", "b"]}, False).structured.kind == "choice"
    with pytest.raises(InvalidRequestError) as error:
        parse_features({"response_format": {"type": "yaml"}}, True)
    assert error.value.param == "response_format"


def test_tool_choice_required_or_named_constrains_the_reply() -> None:
    auto = parse_features({"tools": TOOLS}, True)
    assert auto.tools == TOOLS and auto.tool_choice == "auto" and auto.structured is None
    assert parse_features({"tools": TOOLS, "tool_choice": "none"}, True).tools is None
    forced = parse_features(
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, True
    )
    assert forced.tool_choice == "get_time" and forced.structured.kind == "grammar"
    with pytest.raises(InvalidRequestError):
        parse_features({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, True)
    with pytest.raises(InvalidRequestError):
        parse_features({"tool_choice": "required"}, True)


def test_logprobs_logit_bias_and_stop_token_ids() -> None:
    chat = parse_features({"logprobs": True, "top_logprobs": 3, "logit_bias": {"5": -100}, "stop_token_ids": [2]}, True)
    assert chat.logprobs == 3 and chat.logit_bias == ((5, -100.0),) and chat.stop_token_ids == (2,)
    assert parse_features({"logprobs": 2}, False).logprobs == 2
    for body, chat_api in (({"top_logprobs": 50, "logprobs": True}, True), ({"logprobs": 9}, False),
                           ({"logit_bias": {"x": 1}}, True), ({"logit_bias": {"1": 500}}, True)):  # fmt: skip
        with pytest.raises(InvalidRequestError):
            parse_features(body, chat_api)


REPLY = (
    'Sure. <tool_call>[\n{"name": "get_time", "arguments": {"tz": "CET", "note": "a \\"quoted\\" }"}}\n]</tool_call>'
)


@pytest.mark.parametrize("seed", range(6))
def test_a_streamed_call_comes_out_as_name_then_argument_deltas_however_it_is_cut(seed: int) -> None:
    rng = random.Random(seed)
    stream = ToolCallStream()
    content, deltas, position = "", [], 0
    while position < len(REPLY):
        step = rng.randint(1, 6)
        text, new = stream.feed(REPLY[position : position + step])
        content, deltas, position = content + text, deltas + new, position + step
    rest, last = stream.finish()
    content += rest
    assert content.strip() == "Sure." and stream.called and last == []
    assert deltas[0]["function"] == {"name": "get_time", "arguments": ""} and deltas[0]["id"].startswith("call_")
    arguments = "".join(d["function"]["arguments"] for d in deltas[1:])
    assert json.loads(arguments) == {"tz": "CET", "note": 'a "quoted" }'}


def test_text_that_only_looks_like_a_call_stays_text() -> None:
    stream = ToolCallStream()
    text, deltas = stream.feed("a < b and <tool")
    assert text == "a < b and " and deltas == []
    assert stream.finish() == ("<tool", []) and not stream.called


FORCED = '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris <3", "unit": "celsius"}}\n]</tool_call>'


@pytest.mark.parametrize("cut", range(len(FORCED)))
def test_a_call_cut_anywhere_reads_the_same_whole_and_streamed_and_is_never_markup(cut: int) -> None:
    """A reply cut off by max tokens inside a call: parse_calls(cut=True) (whole replies) and the stream agree."""
    text = FORCED[:cut]
    rest, calls = parse_calls(text, cut=True)
    stream = ToolCallStream()
    content, deltas = stream.feed(text)
    more, last = stream.finish(cut=True)
    content, deltas = content + more, deltas + last
    assert rest == content == ""
    streamed = [(d["function"]["name"], "") for d in deltas if "id" in d]
    for delta in deltas:
        if "id" not in delta:
            name, arguments = streamed[delta["index"]]
            streamed[delta["index"]] = (name, arguments + delta["function"]["arguments"])
    assert streamed == [(c.name, c.arguments) for c in calls]
    assert [c.name for c in calls] == (["get_weather"] if cut >= FORCED.index('", "arg') + 1 else [])
