"""The README's compatibility table is true: every row is sent to a real `inference-studio serve` (the tiny model);
an endpoint or field marked yes is answered, one marked no is a 404 (endpoint) or a 400 naming the field."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.serving import ServedStudio

README = Path(__file__).resolve().parents[3] / "README.md"
ROW = re.compile(r"^\| (?:`(?P<endpoint>(?:GET|POST) [^`]+)`|(?P<api>chat|completions|responses) `(?P<field>[^`]+)`) "
                 r"\| (?P<supported>yes|no) \|")  # fmt: skip
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
FLAT_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
# each field's example: the fields sent (beside the base request) to show the row holds
EXAMPLES: dict[str, dict[str, dict]] = {
    "chat": {
        "messages": {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        "max_tokens": {"max_tokens": 3},
        "max_completion_tokens": {"max_completion_tokens": 3},
        "temperature": {"temperature": 0.5},
        "top_p": {"top_p": 0.9},
        "n": {"n": 1},
        "stream": {"stream": True},
        "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
        "stop": {"stop": ["zz"]},
        "seed": {"seed": 3},
        "presence_penalty": {"presence_penalty": 0.5},
        "frequency_penalty": {"frequency_penalty": 0.5},
        "logit_bias": {"logit_bias": {"5": 1}},
        "logprobs": {"logprobs": True},
        "top_logprobs": {"logprobs": True, "top_logprobs": 2},
        "response_format": {"response_format": {"type": "json_object"}},
        "tools": {"tools": [TOOL]},
        "tool_choice": {"tools": [TOOL], "tool_choice": "required"},
        "parallel_tool_calls": {"tools": [TOOL], "parallel_tool_calls": True},
        "user": {"user": "someone"},
        "top_k": {"top_k": 5},
        "min_p": {"min_p": 0.1},
        "repetition_penalty": {"repetition_penalty": 1.1},
        "min_tokens": {"min_tokens": 1},
        "ignore_eos": {"ignore_eos": True},
        "stop_token_ids": {"stop_token_ids": [5]},
        "structured_outputs": {"structured_outputs": {"choice": ["a", "b"]}},
        "return_tokens_as_token_ids": {"logprobs": True, "return_tokens_as_token_ids": True},
        "functions": {"functions": [{"name": "f", "parameters": {}}]},
        "function_call": {"function_call": {"name": "f"}},
    },
    "completions": {
        "prompt": {"prompt": [5, 6, 7]},
        "logprobs": {"logprobs": 2},
        "echo": {"echo": True},
        "suffix": {"suffix": "the end"},
        "best_of": {"best_of": 2},
    },
    "responses": {
        "input": {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]},
        "instructions": {"instructions": "Be brief."},
        "max_output_tokens": {"max_output_tokens": 3},
        "tools": {"tools": [FLAT_TOOL]},
        "tool_choice": {"tools": [FLAT_TOOL], "tool_choice": "required"},
        "text": {"text": {"format": {"type": "json_object"}}},
        "previous_response_id": {"previous_response_id": None},  # filled with a response the test creates
        "store": {"store": False},
        "stream": {"stream": True},
        "metadata": {"metadata": {"k": "v"}},
        "background": {"background": True},
        "reasoning": {"reasoning": {"effort": "low"}},
        "include": {"include": ["reasoning.encrypted_content"]},
        "conversation": {"conversation": "conv_1"},
        "truncation": {"truncation": "auto"},
    },
}
BASE = {
    "chat": ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 2}),
    "completions": ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2}),
    "responses": ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 2}),
}  # fmt: skip


def table() -> list[dict]:
    rows = [m.groupdict() for line in README.read_text().splitlines() if (m := ROW.match(line))]
    assert len(rows) > 50, "the compatibility table is missing or unreadable"
    return rows


def test_every_field_of_the_table_has_an_example_and_every_example_a_row() -> None:
    fields = {(r["api"], r["field"]) for r in table() if r["api"]}
    examples = {(api, name) for api, names in EXAMPLES.items() for name in names}
    assert fields == examples


@pytest.fixture(scope="module")
def http(tiny_server: ServedStudio, server_api_key: str):
    with httpx.Client(base_url=tiny_server.url, headers={"Authorization": f"Bearer {server_api_key}"},
                      timeout=60) as client:  # fmt: skip
        yield client


def test_every_row_holds(http: httpx.Client) -> None:
    stored = http.post("/v1/responses", json=BASE["responses"][1]).json()["id"]
    wrong = []
    for row in table():
        supported = row["supported"] == "yes"
        if row["endpoint"]:
            method, path = row["endpoint"].split(" ")
            path = path.replace("{id}", stored)
            body = next((b for route, b in BASE.values() if route == path), {"model": "tiny", "input": "hi"})
            answer = http.request(method, path, json=body if method == "POST" else None)
            ok = answer.status_code == 200 if supported else answer.status_code == 404
        else:
            route, base = BASE[row["api"]]
            extra = dict(EXAMPLES[row["api"]][row["field"]])
            if row["field"] == "previous_response_id":
                extra["previous_response_id"] = stored
            answer = http.post(route, json={**base, **extra})
            param = answer.json()["error"]["param"] if answer.status_code == 400 else None
            ok = answer.status_code == 200 if supported else (answer.status_code, param) == (400, row["field"])
        if not ok:
            wrong.append(f"{row}: {answer.status_code} {answer.text[:200]}")
    assert not wrong, "\n".join(wrong)
