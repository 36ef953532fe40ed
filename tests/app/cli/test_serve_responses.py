"""The Responses API through `inference-studio serve` on the embedded model, with the official openai client: text
and message input, instructions, streaming with the SDK's own event helper, function tools and their outputs,
text.format json_schema via parse(), previous_response_id, and clean 400s for what a local text model cannot do.
Every answer is validated against the SDK's own types (openai.types.responses)."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from tests.serving import ServedStudio

MODEL = "smollm2"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def client(embedded_server: ServedStudio) -> openai.OpenAI:
    return openai.OpenAI(base_url=embedded_server.base_url, api_key="unused", max_retries=0, timeout=120)


def create(client: openai.OpenAI, **fields) -> Response:
    """client.responses.create, its raw JSON validated against the SDK's Response type (create() itself is lenient)."""
    raw = client.responses.with_raw_response.create(model=MODEL, **fields)
    return Response.model_validate(raw.http_response.json())


def cache_the_prompt(client: openai.OpenAI, **fields) -> None:
    """One request first, so that the compared ones both find the prompt's pages cached and compute the same tail.
    A fresh prompt is computed in one prefill, a cached one's last tokens alone: where this machine measured different
    weight formats for those row counts, the two round differently, and a greedy near-tie can go either way."""
    client.responses.create(model=MODEL, max_output_tokens=1, temperature=0, **fields)


def test_text_input_with_instructions(client: openai.OpenAI) -> None:
    cache_the_prompt(client, input="What is the capital of France?", instructions="Answer in one short sentence.")
    response = create(client, input="What is the capital of France?", instructions="Answer in one short sentence.",
                      max_output_tokens=30, temperature=0)  # fmt: skip
    assert response.status == "completed" and response.object == "response" and response.id.startswith("resp_")
    assert "Paris" in response.output_text
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert response.usage.output_tokens >= 1 and response.usage.input_tokens > 10
    assert response.instructions == "Answer in one short sentence." and response.max_output_tokens == 30
    same = client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=30,
                                   instructions="Answer in one short sentence.", temperature=0)  # fmt: skip
    assert same.output_text == response.output_text  # greedy: the SDK's own create() reads the same


def test_message_items_and_a_cut_reply_is_incomplete(client: openai.OpenAI) -> None:
    items = [
        {"role": "developer", "content": "You are terse."},
        {"role": "user", "content": [{"type": "input_text", "text": "Write a long story about a dragon."}]},
    ]
    response = create(client, input=items, max_output_tokens=5, temperature=0)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 5 and response.output_text


def test_streaming_events_as_the_sdk_reads_them(client: openai.OpenAI) -> None:
    cache_the_prompt(client, input="Say hello to Ada.")
    kinds, numbers, deltas = [], [], []
    with client.responses.stream(model=MODEL, input="Say hello to Ada.", max_output_tokens=20, temperature=0) as s:
        for event in s:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = s.get_final_response()
    assert numbers == list(range(len(numbers)))
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # fmt: skip
    assert "".join(deltas) == final.output_text and final.output_text
    whole = client.responses.create(model=MODEL, input="Say hello to Ada.", max_output_tokens=20, temperature=0)
    assert whole.output_text == final.output_text


def test_a_forced_function_call_its_output_and_the_answer(client: openai.OpenAI) -> None:
    ask = "What is the weather like in Paris?"
    cache_the_prompt(client, input=ask, tools=[WEATHER], tool_choice="required")
    first = create(client, input=ask, tools=[WEATHER], tool_choice="required", temperature=0, max_output_tokens=60)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert set(json.loads(call.arguments)) == {"city"} and first.status == "completed"
    # streamed: the call's arguments arrive as deltas, and the final response holds the same call
    with client.responses.stream(model=MODEL, input=ask, tools=[WEATHER], tool_choice="required", temperature=0,
                                 max_output_tokens=60) as stream:  # fmt: skip
        events = list(stream)
        streamed = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.output_text.delta" not in kinds
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert arguments == streamed.output[0].arguments == call.arguments
    # the result goes back by previous_response_id and a function_call_output item; the model answers in text
    replay = [
        {"role": "user", "content": ask},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny", "celsius": 21}'},
    ]
    cache_the_prompt(client, tools=[WEATHER], store=False, input=replay)
    answer = create(client, previous_response_id=first.id, tools=[WEATHER], temperature=0, max_output_tokens=40,
                    input=[{"type": "function_call_output", "call_id": call.call_id,
                            "output": '{"sky": "sunny", "celsius": 21}'}])  # fmt: skip
    assert answer.previous_response_id == first.id and answer.output_text
    assert answer.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # the same conversation sent in full, without the store, is the same prompt
    replayed = create(client, tools=[WEATHER], temperature=0, max_output_tokens=40, store=False, input=replay)
    assert replayed.output_text == answer.output_text
    assert replayed.usage.input_tokens == answer.usage.input_tokens


class Pet(BaseModel):
    name: str = Field(max_length=12)
    legs: int = Field(ge=0, le=8)


def test_text_format_json_schema_through_parse(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(model=MODEL, input="Describe a pet.", text_format=Pet, max_output_tokens=60)
    assert isinstance(parsed.output_parsed, Pet) and parsed.status == "completed"
    assert parsed.text.format.type == "json_schema"


def test_previous_response_id_carries_the_conversation_and_retrieve(client: openai.OpenAI) -> None:
    first = create(client, input="My name is Ada. Say OK.", max_output_tokens=8, temperature=0)
    second = create(client, input="What is my name?", previous_response_id=first.id, max_output_tokens=8,
                    temperature=0)  # fmt: skip
    alone = create(client, input="What is my name?", max_output_tokens=8, temperature=0)
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(first.id).output_text == first.output_text
    unstored = create(client, input="hi", max_output_tokens=2, store=False)
    for missing in ("resp_nope", unstored.id):
        with pytest.raises(openai.BadRequestError) as error:
            client.responses.create(model=MODEL, input="again", previous_response_id=missing)
        assert error.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools", "built-in tool 'web_search'"),
        ({"tools": [WEATHER, {"type": "file_search", "vector_store_ids": ["v"]}]}, "tools", "'file_search'"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                                 {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]},
         "input", "content part 1 is of type 'input_image'"),
        ({"background": True}, "background", "'background' is not supported"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "'reasoning' is not supported"),
        ({"max_output_tokens": 0}, "max_output_tokens", "'max_output_tokens' must be at least 1"),
        ({"text": {"format": {"type": "xml"}}}, "text.format", "text.format.type"),
    ],
)  # fmt: skip
def test_what_a_local_text_model_cannot_do_is_a_400_naming_it(
    client: openai.OpenAI, fields: dict, param: str, words: str
) -> None:
    body = {"input": "hi", **fields}
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model=MODEL, **body)
    assert error.value.body["param"] == param and words in error.value.body["message"]


def test_every_streamed_event_is_one_of_the_sdks_event_types(embedded_server: ServedStudio) -> None:
    """Read the raw SSE: each data line validates as openai.types.responses.ResponseStreamEvent, and its name line
    matches its type (strict: the SDK itself builds events leniently)."""
    import httpx

    body = {"model": MODEL, "input": "Write a long poem.", "stream": True, "max_output_tokens": 3}
    with httpx.stream("POST", f"{embedded_server.base_url}/responses", json=body, timeout=120) as reply:
        blocks = [b for b in reply.read().decode().split("\n\n") if b.strip()]
    for block in blocks:
        name, data = block.split("\n")
        event = STREAM_EVENT.validate_python(json.loads(data.removeprefix("data: ")))
        assert name == f"event: {event.type}"
    last = json.loads(blocks[-1].split("\n")[1][6:])
    assert last["type"] == "response.completed" and last["response"]["status"] == "incomplete"  # cut at 3 tokens
