"""Request bodies checked into engine inputs: OpenAI's defaults, vLLM's extras, one choice per request."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.serve.completions_wire import ResponseWriter
from engine.serve.openai_protocol import ApiError, parse_chat_request, parse_completion_request

HELLO = [{"role": "user", "content": "hi"}]


def test_defaults_follow_openai() -> None:
    request = parse_chat_request({"model": "m", "messages": HELLO})
    assert request.params.temperature == 1.0 and request.params.top_p == 1.0
    assert request.max_tokens_param is None and not request.stream and not request.include_usage


def test_fields_and_vllm_extras() -> None:
    request = parse_chat_request({
        "model": "m", "messages": HELLO, "max_completion_tokens": 9, "max_tokens": 3, "temperature": 0,
        "top_p": 0.5, "seed": 3, "stop": "END", "stream": True, "stream_options": {"include_usage": True},
        "top_k": -1, "min_p": 0.1, "repetition_penalty": 1.2, "ignore_eos": True, "presence_penalty": 0,
        "user": "someone",
    })  # fmt: skip
    p = request.params
    assert (p.max_tokens, p.temperature, p.top_p, p.seed, p.stop) == (9, 0.0, 0.5, 3, ("END",))
    assert (p.top_k, p.min_p, p.repetition_penalty, p.ignore_eos) == (0, 0.1, 1.2, True)
    assert request.stream and request.include_usage and request.max_tokens_param == "max_completion_tokens"


def test_completion_prompts() -> None:
    assert parse_completion_request({"model": "m", "prompt": ["once"]}).prompt == "once"
    assert parse_completion_request({"model": "m", "prompt": [[1, 2]]}).prompt_ids == [1, 2]
    with pytest.raises(ApiError) as info:
        parse_completion_request({"model": "m", "prompt": ""})
    assert info.value.status == 400 and info.value.param == "prompt"


@pytest.mark.parametrize(
    "extra",
    [{"max_tokens": True}, {"temperature": float("nan")}, {"presence_penalty": 2.5}, {"best_of": 2},
     {"response_format": {"type": "xml"}}, {"functions": [{"name": "f"}]}, {"stop": [""]}, {"top_k": -5},
     {"logprobs": True, "top_logprobs": 21}, {"logit_bias": {"x": 1}}, {"tool_choice": "required"}],
)  # fmt: skip
def test_refusals(extra: dict) -> None:
    with pytest.raises(ApiError) as info:
        parse_chat_request({"model": "m", "messages": HELLO, **extra})
    body = info.value.body()["error"]
    assert info.value.status == 400 and body["type"] == "invalid_request_error" and body["message"]


def test_stream_chunks_have_openai_shape() -> None:
    writer = ResponseWriter("chat", "chatcmpl-1", "m")
    first = writer.chunk("", first=True, with_usage=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""} and first["usage"] is None
    last = writer.chunk(None, "abort", with_usage=False)
    assert last["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert writer.usage_chunk({"prompt_tokens": 1})["choices"] == []


# ---- any body: a checked request or a 4xx ApiError, never another exception --------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "seed", "stop", "stream", "stream_options", "n", "min_tokens", "repetition_penalty", "ignore_eos",
          "logprobs", "top_logprobs", "response_format", "tools", "tool_choice", "logit_bias", "stop_token_ids",
          "structured_outputs", "guided_regex", "guided_choice"]  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=10) | json_values)
@example({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})  # found by this test: were 500s
@example({"messages": [{"role": ["user"], "content": "hi"}]})
@example({"messages": HELLO, "seed": 2**70, "stop": ["x"] * 100, "top_k": 2**70})
def test_any_body_is_a_request_or_a_4xx(body) -> None:
    if isinstance(body, dict):
        body.setdefault("model", "m")
    for parse in (parse_chat_request, parse_completion_request):
        try:
            parse(body)
        except ApiError as exc:
            assert 400 <= exc.status < 500 and exc.body()["error"]["message"]
