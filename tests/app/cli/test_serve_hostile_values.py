"""Values a hostile probe found 500s and wrong answers with, against a real `inference-studio serve`: lone
surrogates, integers past Python's 4,300-digit limit, and sampling values so close to zero that the arithmetic
breaks (a sub-epsilon temperature is greedy; a tiny top_p keeps the top token; a tiny penalty is refused)."""

from __future__ import annotations

import httpx
import pytest

from tests.serving import ServedStudio

MODEL = "tiny"
CHAT = "/v1/chat/completions"
TIMEOUT_S = 60


def send(server: ServedStudio, key: str, body: bytes | dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if isinstance(body, dict):
        return httpx.post(f"{server.url}{CHAT}", json=body, headers=headers, timeout=TIMEOUT_S)
    return httpx.post(f"{server.url}{CHAT}", content=body, headers=headers, timeout=TIMEOUT_S)


def reply(server: ServedStudio, key: str, **extra) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 8, **extra}
    response = send(server, key, body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


GOOD = b'"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2'


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": "\\ud800", ' + GOOD + b"}", "model"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\udfffb"}], "max_tokens": 2}', "messages"),
        (b'{"model": "tiny", ' + GOOD + b', "stop": ["\\ud83d"]}', "stop"),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 5000 + b"}",
            None,
        ),
        (b'{"model": "tiny", ' + GOOD + b', "seed": ' + b"9" * 4301 + b"}", None),
    ],
    ids=["surrogate-model", "surrogate-content", "surrogate-stop", "digits-max-tokens", "digits-seed"],
)
def test_lone_surrogates_and_huge_integers_are_400s(tiny_server: ServedStudio, server_api_key, raw, param) -> None:
    response = send(tiny_server, server_api_key, raw)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "surrogate" in error["message"] or "digits" in error["message"]


def test_a_sub_epsilon_temperature_is_greedy(tiny_server: ServedStudio, server_api_key) -> None:
    greedy = reply(tiny_server, server_api_key, temperature=0)
    assert reply(tiny_server, server_api_key, temperature=1e-40) == greedy
    assert reply(tiny_server, server_api_key, temperature=1e-40, seed=3) == greedy


def test_a_vanishing_top_p_keeps_the_top_token(tiny_server: ServedStudio, server_api_key) -> None:
    greedy = reply(tiny_server, server_api_key, temperature=0)
    assert reply(tiny_server, server_api_key, temperature=1.0, top_p=5e-324, seed=1) == greedy


@pytest.mark.parametrize("penalty", [1e-300, 1e-5])
def test_a_penalty_below_the_floor_is_refused(tiny_server: ServedStudio, server_api_key, penalty: float) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "repetition_penalty": penalty}
    response = send(tiny_server, server_api_key, body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "repetition_penalty"


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": 1e-40},
        {"temperature": 1e-30, "seed": 5},
        {"repetition_penalty": 0.01, "temperature": 0.5, "seed": 2},
        {"top_p": 5e-324, "temperature": 1.0},
    ],
)
@pytest.mark.parametrize("guided", [{"guided_choice": ["yes", "no"]}, {"guided_regex": "[a-z]{1,6}"}])
def test_near_zero_sampling_values_with_a_grammar_give_valid_output(
    tiny_server: ServedStudio, server_api_key, extra: dict, guided: dict
) -> None:
    """These made the sampler pick a token the grammar forbids ("grammar refused token 49151", a 500)."""
    text = reply(tiny_server, server_api_key, **extra, **guided)
    if "guided_choice" in guided:
        assert text in ("yes", "no")
    else:
        assert text.isalpha() and text.islower() and 1 <= len(text) <= 6
