"""The OpenAI features apps use, through `inference-studio serve` on the embedded model with the official openai
client: structured output (parse() on generated schemas), forced tool calls streamed and whole, logprobs, logit_bias,
stop_token_ids, a tool result sent back."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, TypeAdapter, create_model

from tests.serving import ServedStudio, cache_the_chat_prompt

MODEL = "smollm2"
ASK = [{"role": "user", "content": "Describe a person you like, as JSON."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}},
                       "required": ["zone"]},
    },
}  # fmt: skip
PARIS = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def client(embedded_server: ServedStudio) -> openai.OpenAI:
    return openai.OpenAI(base_url=embedded_server.base_url, api_key="unused", max_retries=0, timeout=120)


# ---- structured output ------------------------------------------------------------------------------------------
FIELD_TYPES = {
    "text": (str, Field(max_length=12)),
    "count": (int, Field(ge=0, le=999)),
    "flag": (bool, ...),
    "kind": (Literal["cat", "dog", "bird"], ...),
    "scores": (list[int], Field(max_length=3)),
}


@st.composite
def pydantic_models(draw) -> type[BaseModel]:
    names = draw(st.lists(st.sampled_from(["name", "age", "city", "job", "pet", "tags"]), min_size=1, max_size=3,
                          unique=True))  # fmt: skip
    fields = {name: FIELD_TYPES[draw(st.sampled_from(sorted(FIELD_TYPES)))] for name in names}
    return create_model("Generated", **fields)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=pydantic_models())
def test_parse_returns_a_valid_object_for_generated_schemas(client: openai.OpenAI, model: type[BaseModel]) -> None:
    completion = client.chat.completions.parse(
        model=MODEL, messages=ASK, response_format=model, max_tokens=200, temperature=0.7, seed=3
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, model)  # parse() validated it against the schema


def test_json_object_and_vllm_extras(client: openai.OpenAI) -> None:
    short = {"type": "json_schema", "json_schema": {"name": "pet", "strict": True, "schema": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "legs": {"type": "integer"}},
        "required": ["name", "legs"], "additionalProperties": False}}}  # fmt: skip
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=60, temperature=0,
                                           response_format=short)  # fmt: skip
    assert reply.choices[0].finish_reason == "stop"
    assert set(json.loads(reply.choices[0].message.content)) == {"name", "legs"}
    # any JSON object: a small model may write one longer than max_tokens (finish_reason "length"); one that ends
    # by itself is whole
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=150, temperature=0, response_format={"type": "json_object"}
    )
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:
        assert reply.choices[0].message.content.lstrip().startswith("{")
    question = [{"role": "user", "content": "Is the sky green? Answer yes or no."}]
    choice = client.chat.completions.create(
        model=MODEL, messages=question, max_tokens=5, extra_body={"structured_outputs": {"choice": ["yes", "no"]}}
    )
    assert choice.choices[0].message.content in ("yes", "no")
    phone = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give me a phone number."}], max_tokens=20,
        extra_body={"guided_regex": r"\d{3}-\d{4}"},
    )  # fmt: skip
    assert TypeAdapter(str).validate_python(phone.choices[0].message.content)
    assert len(phone.choices[0].message.content) == 8 and phone.choices[0].message.content[3] == "-"


# ---- tool calls -------------------------------------------------------------------------------------------------
def _check_call(name: str, arguments: str, tool: dict) -> None:
    assert name == tool["function"]["name"]
    properties = tool["function"]["parameters"]["properties"]
    parsed = json.loads(arguments)
    assert set(parsed) == set(properties)
    if name == "get_weather":
        assert isinstance(parsed["city"], str) and parsed["unit"] in ("celsius", "fahrenheit")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_calls_always_parse_whole_and_streamed(client: openai.OpenAI, choice) -> None:
    tools = [WEATHER, TIME]
    expected = TIME if isinstance(choice, dict) else None
    for temperature, seed in ((0.0, None), (1.0, 1), (1.0, 2)):
        whole = client.chat.completions.create(
            model=MODEL, messages=PARIS, tools=tools, tool_choice=choice, max_tokens=120, temperature=temperature,
            seed=seed,
        )  # fmt: skip
        reply = whole.choices[0]
        assert reply.finish_reason == "tool_calls" and reply.message.content is None
        (call,) = reply.message.tool_calls
        assert call.id.startswith("call_") and call.type == "function"
        _check_call(call.function.name, call.function.arguments, expected or _tool(call.function.name))
        # the same request streamed: the name first, then the arguments in pieces, as vLLM streams them
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=PARIS, tools=tools, tool_choice=choice, max_tokens=120, temperature=temperature,
                seed=seed, stream=True,
            )
        )  # fmt: skip
        deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
        assert deltas[0].function.name and deltas[0].id.startswith("call_")
        assert all(d.index == 0 for d in deltas)
        arguments = "".join(d.function.arguments or "" for d in deltas)
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
        if temperature == 0.0:
            assert (deltas[0].function.name, arguments) == (call.function.name, call.function.arguments)
        _check_call(deltas[0].function.name, arguments, expected or _tool(deltas[0].function.name))


def _tool(name: str) -> dict:
    return {"get_weather": WEATHER, "get_time": TIME}[name]


def test_a_tool_result_goes_back_and_the_model_answers(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=MODEL, messages=PARIS, tools=[WEATHER], tool_choice="required", max_tokens=80, temperature=0
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        *PARIS,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    answer = client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], max_tokens=40, temperature=0
    )  # tool_choice auto: the model may answer in text
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    message = answer.choices[0].message
    assert message.content or message.tool_calls
    none = client.chat.completions.create(model=MODEL, messages=PARIS, tools=[WEATHER], tool_choice="none",
                                          max_tokens=20, temperature=0)  # fmt: skip
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content


# ---- logprobs, logit_bias, stop_token_ids ----------------------------------------------------------------------
def test_top_logprobs_are_sorted_and_the_greedy_choice_comes_first(client: openai.OpenAI) -> None:
    cache_the_chat_prompt(client, model=MODEL, messages=PARIS, temperature=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=PARIS, max_tokens=12, temperature=0, logprobs=True, top_logprobs=5
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(item.token for item in content) == reply.choices[0].message.content
    for item in content:
        tops = [t.logprob for t in item.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        assert item.top_logprobs[0].token == item.token and item.top_logprobs[0].logprob == pytest.approx(item.logprob)
        assert item.logprob <= 0 and bytes(item.bytes).decode("utf-8", "replace") == item.token
    streamed = client.chat.completions.create(
        model=MODEL, messages=PARIS, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2, stream=True
    )
    items = [i for c in streamed if c.choices and c.choices[0].logprobs for i in c.choices[0].logprobs.content]
    assert [i.token for i in items] == [i.token for i in content]
    assert [i.logprob for i in items] == pytest.approx([i.logprob for i in content], abs=1e-4)
    text = client.completions.create(model=MODEL, prompt="The capital of Germany is", max_tokens=4, temperature=0,
                                     logprobs=3)  # fmt: skip
    logprobs = text.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 4
    assert logprobs.text_offset[0] == 0 and "".join(logprobs.tokens) == text.choices[0].text
    pairs = zip(logprobs.top_logprobs, logprobs.token_logprobs, strict=True)
    assert all(max(top.values()) == pytest.approx(lp) for top, lp in pairs)


def test_logit_bias_and_stop_token_ids(client: openai.OpenAI) -> None:
    prompt = "The capital of Germany is"
    free = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, logprobs=0)
    first_token = free.choices[0].logprobs.tokens[0]
    # vLLM's return_tokens_as_token_ids: tokens as "token_id:N", so that a client can name them in logit_bias
    ids = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, logprobs=1,
                                    extra_body={"return_tokens_as_token_ids": True})  # fmt: skip
    label = ids.choices[0].logprobs.tokens[0]
    assert label.startswith("token_id:")
    first_id = int(label.removeprefix("token_id:"))
    biased = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, logprobs=0,
                                       logit_bias={str(first_id): -100})  # fmt: skip
    assert biased.choices[0].logprobs.tokens[0] != first_token
    stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                        extra_body={"stop_token_ids": [first_id]})  # fmt: skip
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 1


def test_free_requests_beside_constrained_ones_are_answered_normally(client: openai.OpenAI) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]

    def free():
        return client.chat.completions.create(model=MODEL, messages=question, max_tokens=24, temperature=0)

    def constrained():
        return client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            max_tokens=60,
            temperature=0.7,
            response_format={"type": "json_object"},
            logprobs=True,
            top_logprobs=3,
        )

    with ThreadPoolExecutor(4) as pool:
        replies = [pool.submit(f) for f in (free, constrained, constrained, free)]
        texts = [r.result().choices[0].message.content for r in replies]
    assert "Paris" in texts[0] and texts[0] == texts[3]
