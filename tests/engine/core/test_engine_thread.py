"""EngineThread: streaming from a background thread, cancel from another thread, failures, shutdown."""

from __future__ import annotations

import threading
import time

import pytest

from engine.errors import InvalidRequestError
from engine.types import SamplingParams


@pytest.fixture
def worker(make_engine):
    from engine.core.engine_thread import EngineThread

    thread = EngineThread(make_engine()).start()
    yield thread
    thread.shutdown()


def test_events_stream_and_results_add_up(worker) -> None:
    handle = worker.submit([5, 6, 7, 8], params=SamplingParams(max_tokens=6, ignore_eos=True))
    events = list(handle.events(timeout=30))
    assert events[-1].finished and not any(e.finished for e in events[:-1])
    assert sum(len(e.token_ids) for e in events) == 6
    result = handle.result(timeout=1)
    assert result.text == "".join(e.text for e in events)
    assert result.stats.output_tokens == 6 and result.stats.ttft_s > 0


def test_text_prompts_use_the_chat_template(worker) -> None:
    handle = worker.submit(prompt="hello", params=SamplingParams(max_tokens=2))
    assert handle.prompt_tokens > 3  # the template wraps it in role markers
    assert handle.result(timeout=30).finish_reason in ("stop", "length")


def test_concurrent_requests_interleave(worker) -> None:
    order: list[str] = []
    worker.add_listener(lambda events: order.extend(e.request_id for e in events))
    handles = [worker.submit([5 + i, 6, 7], params=SamplingParams(max_tokens=8, ignore_eos=True)) for i in range(3)]
    for handle in handles:
        handle.result(timeout=30)
    firsts = [order.index(h.request_id) for h in handles]
    lasts = [len(order) - 1 - order[::-1].index(h.request_id) for h in handles]
    assert max(firsts) < min(lasts)  # every stream started before any ended: they ran together


def test_cancel_from_another_thread_stops_within_a_step(worker) -> None:
    handle = worker.submit([5, 6, 7], params=SamplingParams(max_tokens=100_000, ignore_eos=True))
    next(iter(handle.events(timeout=30)))
    threading.Thread(target=handle.cancel).start()
    result = handle.result(timeout=30)
    assert result.finish_reason == "abort"
    used = worker.call(lambda engine: engine.pool.num_used).result(timeout=10)
    assert used == 0
    worker.cancel(handle.request_id)  # again: harmless
    worker.cancel("never-existed")


def test_bad_input_raises_in_the_caller(worker) -> None:
    with pytest.raises(InvalidRequestError):
        worker.submit([], params=SamplingParams())
    with pytest.raises(InvalidRequestError):
        worker.submit(prompt="   ")
    with pytest.raises(InvalidRequestError):
        worker.submit([5], params=SamplingParams(top_p=2.0))


def test_a_failing_step_reports_on_the_handle_and_the_thread_lives(worker) -> None:
    def explode(out) -> None:
        worker.engine.fault_injector = None
        raise RuntimeError("boom")

    worker.call(lambda engine: setattr(engine, "fault_injector", explode)).result(timeout=10)
    failed = worker.submit([5, 6], params=SamplingParams(max_tokens=4))
    result = failed.result(timeout=30)
    assert result.finish_reason == "error" and "boom" in result.error
    ok = worker.submit([5, 6], params=SamplingParams(max_tokens=4, ignore_eos=True)).result(timeout=30)
    assert ok.finish_reason == "length" and worker.alive


def test_shutdown_cancels_running_requests(make_engine) -> None:
    from engine.core.engine_thread import EngineThread

    worker = EngineThread(make_engine()).start()
    handle = worker.submit([5, 6, 7], params=SamplingParams(max_tokens=100_000, ignore_eos=True))
    next(iter(handle.events(timeout=30)))
    started = time.monotonic()
    worker.shutdown()
    assert not worker.alive and time.monotonic() - started < 10
    assert handle.result(timeout=1).finish_reason == "abort"
