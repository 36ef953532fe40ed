"""What client libraries expect of an OpenAI-compatible server, through `inference-studio serve` on the embedded
model with the official openai client: a forced tool call cut off by max_tokens, non-text content parts, the first
chunk of a tool-call stream, presence and frequency penalties."""

from __future__ import annotations

import json
from collections import Counter

import openai
import pytest
from pydantic import BaseModel

from tests.serving import ServedStudio, cache_the_chat_prompt

MODEL = "smollm2"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
PARIS = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def client(embedded_server: ServedStudio) -> openai.OpenAI:
    return openai.OpenAI(base_url=embedded_server.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("max_tokens", [4, 13, 17, 26])
def test_a_forced_call_cut_by_max_tokens_is_the_same_call_whole_and_streamed(
    client: openai.OpenAI, max_tokens: int
) -> None:
    ask = {"model": MODEL, "messages": PARIS, "tools": [WEATHER], "tool_choice": "required", "temperature": 0}
    cache_the_chat_prompt(client, **ask)
    whole = client.chat.completions.create(**ask, max_tokens=max_tokens).choices[0]
    assert whole.finish_reason == "length"
    assert "tool_call" not in (whole.message.content or "")  # never the template's markup
    chunks = list(client.chat.completions.create(**ask, max_tokens=max_tokens, stream=True))
    streamed_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert streamed_text == (whole.message.content or "")
    if whole.message.tool_calls:
        (call,) = whole.message.tool_calls
        assert whole.message.content is None and call.function.name == "get_weather"
        assert deltas[0].function.name == "get_weather"
        assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
        assert call.function.arguments == "" or call.function.arguments.startswith("{")
    else:
        assert deltas == []
    if max_tokens >= 17:  # past the name: a call with what arguments there are
        assert whole.message.tool_calls


def test_a_tool_call_stream_starts_with_null_content(client: openai.OpenAI) -> None:
    """OpenAI sends content null beside a tool call; "" made the SDK's stream helper report a text delta."""
    ask = {"model": MODEL, "messages": PARIS, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60}
    with client.chat.completions.stream(**ask, temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "content.delta" not in kinds and "tool_calls.function.arguments.done" in kinds
    assert final.choices[0].message.content is None
    first = next(iter(client.chat.completions.create(**ask, stream=True)))
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content is None
    plain = next(iter(client.chat.completions.create(model=MODEL, messages=PARIS, max_tokens=2, stream=True)))
    assert plain.choices[0].delta.content == ""  # without tools, as OpenAI


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    ],
)
def test_a_non_text_content_part_is_a_400_naming_it(client: openai.OpenAI, part: dict) -> None:
    content = [{"type": "text", "text": "What is in this picture?"}, part]
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4)
    assert error.value.body["param"] == "messages"
    assert f"content part 1 is of type '{part['type']}'" in error.value.body["message"]
    assert "text only" in error.value.body["message"]
    text_parts = [{"type": "text", "text": "Say "}, {"type": "text", "text": "hello."}]
    said = [{"role": "user", "content": text_parts}]
    reply = client.chat.completions.create(model=MODEL, messages=said, max_tokens=4)
    assert reply.choices[0].message.content


def test_presence_and_frequency_penalties_are_applied(client: openai.OpenAI) -> None:
    """Chat UIs send them; 0 was the only value accepted before. Greedy and run to 24 tokens (min_tokens), so the
    difference is the penalties'."""
    ask = [{"role": "user", "content": "Say 'yes' twenty times."}]
    fixed = {"model": MODEL, "messages": ask, "max_tokens": 24, "temperature": 0, "extra_body": {"min_tokens": 24}}
    cache_the_chat_prompt(client, **fixed)
    plain = client.chat.completions.create(**fixed).choices[0].message.content
    penalised = client.chat.completions.create(**fixed, presence_penalty=1.5, frequency_penalty=1.0)
    streamed = client.chat.completions.create(**fixed, presence_penalty=1.5, frequency_penalty=1.0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == penalised.choices[0].message.content != plain

    def most_repeated(reply: str) -> int:
        return max(Counter(reply.lower().replace(",", " ").split()).values())

    assert most_repeated(text) < most_repeated(plain)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=ask, max_tokens=2, frequency_penalty=2.5)
    assert error.value.body["param"] == "frequency_penalty"


# ---- instructor ---------------------------------------------------------------------------------------------------
# instructor 1.17 cannot be a test extra here: it pins jiter<0.15, which the openai client in use (3.57, jiter>=0.16)
# rules out, so installing it would downgrade the client. These tests send exactly what instructor 1.17 sends for
# Mode.TOOLS and Mode.JSON_SCHEMA (its openai handlers) and read the reply as it does.
class Address(BaseModel):
    city: str
    country: str


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str
    age: int
    address: Address


def instructor_tool(model: type[BaseModel]) -> dict:
    """instructor's generate_openai_schema: the model's JSON schema without its title and description as the
    parameters (closed or open as pydantic writes it: no additionalProperties), the docstring as the description."""
    schema = model.model_json_schema()
    parameters = {k: v for k, v in schema.items() if k not in ("title", "description")}
    parameters["required"] = sorted(schema.get("required", []))
    description = (model.__doc__ or "").strip() or (
        f"Correctly extracted `{model.__name__}` with all the required parameters with correct types"
    )
    return {"name": schema["title"], "description": description, "parameters": parameters}


TEXT = [{"role": "user", "content": "Extract: Jason is 25 years old and lives in Paris, France."}]


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (0.7, 1), (0.7, 2)])
def test_instructor_mode_tools_gets_a_complete_valid_call(client: openai.OpenAI, temperature: float, seed) -> None:
    schema = instructor_tool(Person)
    assert "additionalProperties" not in json.dumps(schema)  # what made objects open before
    reply = client.chat.completions.create(
        model=MODEL, messages=TEXT, max_tokens=200, temperature=temperature, seed=seed,
        tools=[{"type": "function", "function": schema}],
        tool_choice={"type": "function", "function": {"name": schema["name"]}},
    ).choices[0]  # fmt: skip
    assert reply.finish_reason != "length"  # instructor raises IncompleteOutputException on "length"
    person = Person.model_validate_json(reply.message.tool_calls[0].function.arguments)
    assert isinstance(person.address, Address)


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (0.7, 3)])
def test_instructor_mode_json_schema_gets_a_complete_valid_object(
    client: openai.OpenAI, temperature: float, seed
) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=TEXT, max_tokens=200, temperature=temperature, seed=seed,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "Person", "schema": Person.model_json_schema()}},
    ).choices[0]  # fmt: skip
    assert reply.finish_reason == "stop"
    assert Person.model_validate_json(reply.message.content).address.city
