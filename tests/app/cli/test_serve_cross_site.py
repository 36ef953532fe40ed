"""Web pages and the server, against real `inference-studio serve` processes: closed to browsers by default (no CORS
headers; a page's text/plain POST, which needs no preflight, is refused), open to the origins --allowed-origin names
(preflights answered, replies readable), and /openapi.json for client generators."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from app.cli.main import main
from tests.serving import ServedStudio, start_studio_server

PAGE = "http://localhost:3000"
ELSEWHERE = "https://evil.example"
BODY = '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'


def preflight(url: str, origin: str) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-lang",
    }
    return httpx.options(f"{url}/v1/chat/completions", headers=headers, timeout=30)


def page_post(url: str, origin: str, content_type: str, key: str | None = None) -> httpx.Response:
    """What a page's fetch() sends without a preflight: a "simple" POST with a text body."""
    headers = {"Origin": origin, "Content-Type": content_type}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(f"{url}/v1/chat/completions", content=BODY, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def open_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """No API key, one allowed page."""
    args = ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--allowed-origin", PAGE + "/"]
    server = start_studio_server(args, tmp_path_factory.mktemp("cors-server"))
    yield server
    server.stop()


def test_closed_by_default_no_cors_headers(tiny_server: ServedStudio, server_api_key: str) -> None:
    answer = preflight(tiny_server.url, PAGE)
    assert "access-control-allow-origin" not in answer.headers
    json_reply = httpx.post(
        f"{tiny_server.url}/v1/chat/completions",
        content=BODY,
        headers={"Origin": PAGE, "Content-Type": "application/json", "Authorization": f"Bearer {server_api_key}"},
        timeout=60,
    )
    assert json_reply.status_code == 200 and "access-control-allow-origin" not in json_reply.headers


def test_allowed_page_gets_preflights_and_readable_replies(open_server: ServedStudio) -> None:
    answer = preflight(open_server.url, PAGE)
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == PAGE
    assert "POST" in answer.headers["access-control-allow-methods"]
    assert "authorization" in answer.headers["access-control-allow-headers"].lower()
    refused = preflight(open_server.url, ELSEWHERE)
    assert "access-control-allow-origin" not in refused.headers
    # the official client, as a page's bundled SDK would call it (browsers add the Origin header)
    client = openai.OpenAI(base_url=open_server.base_url, api_key="unused", default_headers={"Origin": PAGE},
                           max_retries=0, timeout=60)  # fmt: skip
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert raw.headers["access-control-allow-origin"] == PAGE
    assert raw.parse().choices[0].finish_reason in ("length", "stop")
    stream = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    assert stream.headers["access-control-allow-origin"] == PAGE
    assert list(stream.parse())[-1].choices[0].finish_reason in ("length", "stop")
    # an error is readable by the page too (401/400/404 in OpenAI's shape)
    with pytest.raises(openai.NotFoundError) as error:
        client.chat.completions.with_raw_response.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert error.value.response.headers["access-control-allow-origin"] == PAGE


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_a_pages_simple_post_without_a_key_is_refused_unless_its_origin_is_allowed(
    open_server: ServedStudio, content_type: str
) -> None:
    refused = page_post(open_server.url, ELSEWHERE, content_type)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "origin_not_allowed"
    assert page_post(open_server.url, "null", content_type).status_code == 403  # a sandboxed page or file://
    assert page_post(open_server.url, PAGE, content_type).status_code == 200  # the allowed page
    # a client that is not a browser sends no Origin: curl's default form type still works
    plain = httpx.post(f"{open_server.url}/v1/chat/completions", content=BODY,
                       headers={"Content-Type": content_type}, timeout=60)  # fmt: skip
    assert plain.status_code == 200


def test_the_keyed_server_refuses_a_pages_simple_post_too(tiny_server: ServedStudio, server_api_key: str) -> None:
    assert page_post(tiny_server.url, ELSEWHERE, "text/plain").status_code == 403
    assert page_post(tiny_server.url, ELSEWHERE, "text/plain", key=server_api_key).status_code == 403


def test_openapi_json_describes_the_routes_and_their_bodies(open_server: ServedStudio) -> None:
    spec = httpx.get(f"{open_server.url}/openapi.json", timeout=30).json()
    assert spec["openapi"].startswith("3.")
    chat = spec["paths"]["/v1/chat/completions"]["post"]
    schema = chat["requestBody"]["content"]["application/json"]["schema"]
    assert set(schema["required"]) == {"model", "messages"} and "tools" in schema["properties"]
    assert {"/v1/models", "/v1/completions", "/health"} <= set(spec["paths"])


def test_a_malformed_origin_is_one_line_and_star_warns(capsys, caplog) -> None:
    assert main(["serve", "--allowed-origin", "localhost:3000/app"]) == 2
    err = capsys.readouterr().err
    assert "'localhost:3000/app' is not an origin" in err and len(err.strip().splitlines()) == 1
    from engine.serve.cross_site import check_origins

    assert check_origins(["HTTP://LocalHost:3000/", "http://localhost:3000"]) == ("http://localhost:3000",)
    assert check_origins(["*"]) == ("*",)
    assert "any web page" in caplog.text
