"""The Responses API's request read into a chat request, its stream of events, and the bounded store behind
previous_response_id."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from engine.serve.limits import ServeLimits
from engine.serve.openai_protocol import ApiError
from engine.serve.response_store import ResponseStore
from engine.serve.responses_events import ResponseEvents, ResponseObject, conversation_after
from engine.serve.responses_request import parse_responses_request
from tests.engine.serve.test_openai_protocol import json_values

LIMITS = ServeLimits()


def parse(body: dict, store: ResponseStore | None = None):
    return parse_responses_request({"model": "m", **body}, store or ResponseStore(), LIMITS)


def test_items_become_chat_messages_and_the_instructions_a_system_message() -> None:
    request = parse({
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text",
                                                                                          "text": "Paris?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Lyon"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "max_output_tokens": 9,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    })  # fmt: skip
    messages = request.gen.messages
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1] == {"role": "user", "content": "Weather in Paris?"}
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]  # one turn's calls in one message
    assert messages[3] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    assert request.conversation[0]["role"] == "user"  # what previous_response_id continues: no instructions
    assert request.gen.params.max_tokens == 9 and request.gen.max_tokens_param == "max_output_tokens"
    assert request.gen.params.structured.kind == "json_schema" and request.gen.tools


def test_errors_are_named_in_the_responses_fields() -> None:
    for body, param in (
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": []}, "input"),
        ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"input": "hi", "tools": [{"type": "code_interpreter"}]}, "tools"),
        ({"input": "hi", "previous_response_id": "resp_x"}, "previous_response_id"),
    ):
        try:
            parse(body)
        except ApiError as error:
            assert error.status == 400 and error.param == param, (body, error.message)
        else:
            raise AssertionError(f"{body} was accepted")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["input", "instructions", "tools", "tool_choice", "text", "max_output_tokens",
                                        "previous_response_id", "store", "metadata", "reasoning", "stream"]),
                       json_values, max_size=6) | json_values)  # fmt: skip
@example({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text"}]}]})
@example({"input": [{"type": "function_call", "call_id": "c", "name": "f"}], "tools": [{"type": "function"}]})
def test_any_body_is_a_request_or_a_4xx(body) -> None:
    if isinstance(body, dict):
        body.setdefault("model", "m")
    try:
        parse_responses_request(body, ResponseStore(), LIMITS)
    except ApiError as exc:
        assert 400 <= exc.status < 500 and exc.message


def test_stream_events_are_the_sdks_types_in_sequence_and_end_with_the_whole_response() -> None:
    request = parse({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {}}]})
    events = ResponseEvents(ResponseObject(request, "m"))
    out = events.start() + events.text("Let me ") + events.text("check.")
    out += events.tool_deltas(
        [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]
    )
    out += events.tool_deltas(
        [{"index": 0, "function": {"arguments": '{"a"'}}, {"index": 0, "function": {"arguments": ": 1}"}}]
    )
    out += events.finish("completed", {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 0,
                         "cache_write_tokens": 0}, "output_tokens": 5, "output_tokens_details":
                         {"reasoning_tokens": 0}, "total_tokens": 8})  # fmt: skip
    parsed = [TypeAdapter(ResponseStreamEvent).validate_python(e) for e in out]
    assert [e.sequence_number for e in parsed] == list(range(len(out)))
    final = Response.model_validate(out[-1]["response"])
    assert final.output[0].content[0].text == "Let me check." and final.output[1].arguments == '{"a": 1}'
    assert [e.type for e in parsed].count("response.output_item.done") == 2
    history = conversation_after(request, out[-1]["response"]["output"])
    assert history[-1]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}


def test_the_store_is_bounded_by_count_and_size_and_forgets_the_least_recently_used() -> None:
    store = ResponseStore(max_responses=3, max_chars=2_000)
    for n in range(4):
        store.put({"id": f"r{n}", "output": []}, [{"role": "user", "content": "x"}])
    assert store.get("r0") is None and len(store) == 3
    store.get("r1")  # used: r2 is now the oldest
    store.put({"id": "big", "output": []}, [{"role": "user", "content": "y" * 1_500}])
    assert store.get("r1") is not None and store.get("r2") is None and store.chars <= 2_000
    store.put({"id": "huge", "output": []}, [{"role": "user", "content": "z" * 5_000}])  # larger than the bound
    assert store.get("huge") is None and store.get("big") is not None
