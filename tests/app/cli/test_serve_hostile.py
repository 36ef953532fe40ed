"""Hostile input against a real `inference-studio serve`: every bad request gets OpenAI's error shape and a 4xx at
once (no 5xx, no dropped connection), bodies are refused before they are read whole, and a forged Host header
(DNS rebinding) gets a 403."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from urllib.parse import urlsplit

import httpx
import pytest

from tests.serving import ServedStudio

MODEL = "tiny"
HELLO = [{"role": "user", "content": "hello world"}]
CHAT = "/v1/chat/completions"
HANG_LIMIT_S = 60  # generous: a refusal must come at once, but the machine is shared


def raw_exchange(server: ServedStudio, head: str, body_parts: list[bytes] = ()) -> tuple[int, dict, dict | None]:
    """Send a request by hand (headers as written, then the body parts), read the whole answer until the server
    closes the connection (the request asks it to). Returns status, headers and the JSON body."""
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=HANG_LIMIT_S) as sock:

        def send() -> None:
            # a server that refuses a body answers and closes while the rest is still on its way: stop sending then
            with contextlib.suppress(OSError):
                sock.sendall(head.encode())
                for part in body_parts:
                    sock.sendall(part)

        # read while sending, as an HTTP client does: the server's close with body bytes unread resets the
        # connection, and a reader that only starts once everything was sent may find its answer gone with it
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            if b"\r\n\r\n" not in data:
                raise
        sender.join(HANG_LIMIT_S)
    header_text, _, body = data.partition(b"\r\n\r\n")
    lines = header_text.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, json.loads(body) if body.strip() else None


def head(server: ServedStudio, key: str, extra: str) -> str:
    host = urlsplit(server.url).netloc
    return (
        f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\n{extra}\r\n"
    )


def assert_openai_error(body: dict | None) -> dict:
    assert body is not None and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_a_body_announced_too_large_is_refused_before_it_is_sent(tiny_server: ServedStudio, server_api_key) -> None:
    """50 MB announced by Content-Length, not one byte of it sent: the answer comes without reading the body."""
    status, _, body = raw_exchange(tiny_server, head(tiny_server, server_api_key, "Content-Length: 50000000\r\n"))
    assert status == 413
    assert "4 MiB" in assert_openai_error(body)["message"]


def test_a_streamed_body_is_cut_off_at_the_cap(tiny_server: ServedStudio, server_api_key) -> None:
    """No Content-Length (chunked): the server counts while it reads and answers 413 once past 4 MiB."""
    piece = b"x" * 65536
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    cap_chunks = 4 * 1024 * 1024 // len(piece) + 1  # just past the cap; the rest is never sent
    status, _, body = raw_exchange(
        tiny_server, head(tiny_server, server_api_key, "Transfer-Encoding: chunked\r\n"), [chunk] * cap_chunks
    )
    assert status == 413 and assert_openai_error(body)["code"] == "request_too_large"


def test_json_nested_100000_deep_is_a_400_and_the_server_keeps_serving(
    tiny_server: ServedStudio, server_api_key
) -> None:
    with httpx.Client(timeout=HANG_LIMIT_S, headers={"Authorization": f"Bearer {server_api_key}"}) as client:
        for body in (b"[" * 100_000, b'{"model": "tiny", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
            response = client.post(f"{tiny_server.url}{CHAT}", content=body)
            assert response.status_code == 400
            assert "nested" in assert_openai_error(response.json())["message"]
        # the same connection goes on serving
        ok = client.post(f"{tiny_server.url}{CHAT}", json={"model": MODEL, "messages": HELLO, "max_tokens": 2})
        assert ok.status_code == 200


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"seed": 2**70}, "seed", "seed"),
        ({"seed": -(2**64)}, "seed", "seed"),
        ({"max_tokens": 10**12}, "max_tokens", "maximum context length"),
        ({"max_completion_tokens": 2040}, "max_completion_tokens", "maximum context length"),
        ({"stop": ["x"] * 10_000}, "stop", "at most 16"),
        ({"stop": ["y" * 10_000]}, "stop", "characters"),
        ({"messages": HELLO * 5000}, "messages", "at most 1024 messages"),
        ({"messages": [{"role": "user", "content": "z" * 1_500_000}]}, "messages", "characters"),
        ({"top_k": 2**70}, "top_k", "top_k"),
        ({"min_tokens": 2**70}, "min_tokens", "min_tokens"),
        ({"repetition_penalty": 1e308}, "repetition_penalty", "repetition_penalty"),
    ],
)
def test_out_of_range_fields_are_400s(tiny_server: ServedStudio, server_api_key, extra, param, words) -> None:
    body = {"model": MODEL, "messages": HELLO, **extra}
    response = httpx.post(
        f"{tiny_server.url}{CHAT}", json=body, headers={"Authorization": f"Bearer {server_api_key}"},
        timeout=HANG_LIMIT_S,
    )  # fmt: skip
    assert response.status_code == 400, response.text
    error = assert_openai_error(response.json())
    assert words in error["message"] and error["param"] == param
    if "max_tokens" in extra or "max_completion_tokens" in extra:
        assert error["code"] == "context_length_exceeded"


@pytest.mark.parametrize("host", ["evil.example.com", "evil.example.com:8000", "127.0.0.1.nip.io", "[2001:db8::1]"])
def test_a_forged_host_header_is_refused(tiny_server: ServedStudio, server_api_key, host: str) -> None:
    """DNS rebinding: a page at evil.example.com whose name now resolves to 127.0.0.1 sends its own Host."""
    headers = {"Host": host, "Authorization": f"Bearer {server_api_key}"}
    for method, path in (("GET", "/v1/models"), ("POST", CHAT), ("GET", "/metrics")):
        response = httpx.request(method, f"{tiny_server.url}{path}", headers=headers, json={}, timeout=HANG_LIMIT_S)
        assert response.status_code == 403
        assert "Host" in assert_openai_error(response.json())["message"]


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "127.0.0.1:1", "[::1]:8000", "127.0.0.1"])
def test_loopback_hosts_are_served(tiny_server: ServedStudio, server_api_key, host: str) -> None:
    headers = {"Host": host, "Authorization": f"Bearer {server_api_key}"}
    assert httpx.get(f"{tiny_server.url}/v1/models", headers=headers, timeout=HANG_LIMIT_S).status_code == 200
