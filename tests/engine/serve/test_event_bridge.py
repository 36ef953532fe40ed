"""The server's event bridge: each request's events reach its stream's queue by one route, its failures included,
and its handle keeps none of them."""

from __future__ import annotations

import asyncio

import pytest

from engine.core.engine_thread import EngineThread
from engine.serve.event_bridge import AsyncEventBridge
from engine.types import SamplingParams

LIMIT_S = 30.0


@pytest.fixture
def worker(make_engine):
    thread = EngineThread(make_engine()).start()
    yield thread
    thread.shutdown()


async def streamed(worker: EngineThread, params: SamplingParams):
    """One request through a bridge, as the server submits it: (its handle, the events its stream yielded)."""
    bridge = AsyncEventBridge(worker, asyncio.get_running_loop())
    try:
        queue = bridge.register("bridged")
        handle = worker.submit([5, 6, 7], params=params, request_id="bridged", sink=bridge.sink)
        events = []
        async with asyncio.timeout(LIMIT_S):
            async for event in bridge.stream(handle, queue):
                events.append(event)
        return handle, events
    finally:
        bridge.close()


def test_a_request_that_fails_while_being_added_reaches_its_stream(worker, monkeypatch) -> None:
    def refuse(*_args, **_kwargs):
        raise RuntimeError("injected while adding")

    monkeypatch.setattr(worker.engine, "add_request", refuse)
    handle, events = asyncio.run(streamed(worker, SamplingParams(max_tokens=4)))
    assert len(events) == 1 and events[0].finish_reason == "error" and "injected while adding" in events[0].error
    assert handle.done and handle.final is events[0]


def test_a_streamed_request_leaves_nothing_queued_on_its_handle(worker) -> None:
    handle, events = asyncio.run(streamed(worker, SamplingParams(max_tokens=40, ignore_eos=True)))
    assert events[-1].finish_reason == "length" and sum(len(e.token_ids) for e in events) == 40
    assert handle.pending == 0 and handle.token_ids == [] and handle.text_parts == []  # bounded: nothing kept
    assert handle.output_tokens == 40 and handle.final is events[-1]
