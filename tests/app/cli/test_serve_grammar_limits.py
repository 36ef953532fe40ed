"""Grammars that blow up, against a real `inference-studio serve` of its own (its memory is read from /proc): each is
refused with a 400 naming the field, and twelve distinct blow-up regexes leave the server's resident memory where
it was (each used to keep about 170 MB for good)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.serving import ServedStudio, start_studio_server

MODEL = "tiny"
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]
TIMEOUT_S = 120  # generous: the machine is shared
#: resident growth allowed over the twelve regexes: the grammar engine's work for one of them at a time, and what the
#: allocator keeps of it; before the bound each regex kept its ~100-170 MB of lexer in the cache (1.2-2 GB in all)
GROWTH_LIMIT_MIB = 300


@pytest.fixture(scope="module")
def own_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """A server of its own: its memory must not carry what other tests did to the session's server."""
    args = ["--model", str(tiny_model_dir), "--served-model-name", MODEL, "--page-size", "8", "--kv-pages", "128"]
    server = start_studio_server(args, tmp_path_factory.mktemp("grammar-limits-server"))
    yield server
    server.stop()


def resident_mib(server: ServedStudio) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc")


def post(server: ServedStudio, **extra) -> httpx.Response:
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 2, **extra}
    return httpx.post(f"{server.url}{CHAT}", json=body, timeout=TIMEOUT_S)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc")
def test_twelve_blow_up_regexes_are_refused_and_leave_memory_bounded(own_server: ServedStudio) -> None:
    assert post(own_server).status_code == 200  # warm: the first request's own allocations are not the grammars'
    before = resident_mib(own_server)
    peak = before
    for n in range(1001, 1013):  # the loop: twelve distinct regexes, each (a{n}){1000}
        response = post(own_server, guided_regex=f"(a{{{n}}}){{1000}}")
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "guided_regex" and "grammar" in error["message"], error
        peak = max(peak, resident_mib(own_server))
    after = resident_mib(own_server)
    assert after - before < GROWTH_LIMIT_MIB, f"resident {before:.0f} -> {after:.0f} MiB (peak {peak:.0f})"
    assert post(own_server).status_code == 200  # and it goes on serving


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        # a required property that is the schema itself: no finite value exists ("Too many items" in the parser)
        ({"guided_json": {"type": "object", "properties": {"c": {"$ref": "#"}}, "required": ["c"]}}, "guided_json"),
        # a $ref loop: used to return empty text with finish_reason stop, which claims a valid (empty) value
        ({"guided_json": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}}, "guided_json"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"$ref": "#"}}}},
            "response_format",
        ),
    ],
)
def test_schemas_no_value_can_satisfy_are_400s(own_server: ServedStudio, extra: dict, param: str) -> None:
    response = post(own_server, **extra)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and json.dumps(error)  # named, and in OpenAI's shape
