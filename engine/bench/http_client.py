"""A workload through an OpenAI-compatible server, as a streaming client sees it: each request sent when it
arrives, as token ids to /v1/completions, timed chunk by chunk (TTFT, inter-token latency, throughput)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx

from engine.bench.results import RequestTiming, SystemResult
from engine.bench.workloads import BenchRequest, Workload
from engine.remote.stream import sse_chunks

REQUEST_TIMEOUT_S = 1800.0  # a whole workload's worth: a stalled server fails the run instead of hanging it
ExtraFields = Callable[[BenchRequest], dict]


def studio_fields(request: BenchRequest) -> dict:
    """The studio's server bans EOS until max_tokens with vLLM's min_tokens; a JSON request asks for its schema."""
    if request.json_schema is not None:
        schema = json.loads(request.json_schema)
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}}
    return {"min_tokens": request.max_new_tokens}


def llama_cpp_fields(request: BenchRequest) -> dict:
    """llama.cpp's ignore_eos gives its end-of-generation tokens a -inf bias: banned, as min_tokens does."""
    return {"ignore_eos": True}


async def _one(
    client: httpx.AsyncClient, model: str, request: BenchRequest, extra: dict, start: float
) -> tuple[RequestTiming, str]:
    await asyncio.sleep(max(0.0, start + request.arrival_s - time.perf_counter()))
    arrival = time.perf_counter()
    body = {
        "model": model,
        "prompt": request.prompt_ids,
        "max_tokens": request.max_new_tokens,
        "temperature": request.temperature,
        **({} if request.greedy else {"top_p": request.top_p, "seed": request.seed}),
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    times: list[float] = []
    text: list[str] = []
    usage: dict = {}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"the server answered {response.status_code}: {(await response.aread())[:300]!r}")
        async for chunk in sse_chunks(response.aiter_lines(), "the server"):
            usage = chunk.get("usage") or usage
            piece = "".join((c.get("text") or "") for c in chunk.get("choices") or [])
            if piece:
                times.append(time.perf_counter())
                text.append(piece)
    tokens = usage.get("completion_tokens") or len(times)
    return RequestTiming(arrival, times, tokens=tokens), "".join(text)


async def _run(url: str, model: str, workload: Workload, extra: ExtraFields) -> tuple[float, list, list[str]]:
    limits = httpx.Limits(max_connections=len(workload.requests) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        start = time.perf_counter()
        done = await asyncio.gather(*(_one(client, model, r, extra(r), start) for r in workload.requests))
    return start, [d[0] for d in done], [d[1] for d in done]


def run_through_server(name: str, url: str, model: str, workload: Workload, extra: ExtraFields) -> SystemResult:
    start, timings, texts = asyncio.run(_run(url, model, workload, extra))
    wall = max(t.token_times[-1] for t in timings if t.token_times) - start
    return SystemResult(name, wall, timings, texts=texts)


def served_model(url: str) -> str:
    """The id the server's /v1/models lists first."""
    response = httpx.get(f"{url}/v1/models", timeout=30)
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])
