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

    def sink(events) -> None:
        order.extend(e.request_id for e in events)

    params = SamplingParams(max_tokens=8, ignore_eos=True)
    handles = [worker.submit([5 + i, 6, 7], params=params, sink=sink) for i in range(3)]
    for handle in handles:
        handle.wait(timeout=30)
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
    worker.shutdown(timeout=60)  # the request is cancelled, not run to its 100,000 tokens: the thread ends
    assert not worker.alive
    result = handle.result(timeout=1)
    assert result.finish_reason == "abort" and len(result.token_ids) < 100_000


# ---- OpenMP: the engine thread computes like the thread that built the engine --------------------------------
def _openmp_or_skip():
    from engine.core import openmp

    if openmp.thread_max_threads() is None:
        pytest.skip("torch does not run on GNU OpenMP here")
    return openmp


def test_the_engine_thread_uses_the_callers_torch_thread_count(make_engine) -> None:
    """OpenMP thread counts are per thread; oneDNN reads this thread's own, not torch.set_num_threads."""
    import torch

    from engine.core.engine_thread import EngineThread

    openmp = _openmp_or_skip()
    box: list[int | None] = []
    fresh = threading.Thread(target=lambda: box.append(openmp.thread_max_threads()))
    fresh.start()
    fresh.join()
    wanted = 1 if box[0] != 1 else 2  # differs from what a new thread starts with
    previous = torch.get_num_threads()
    torch.set_num_threads(wanted)
    try:
        with EngineThread(make_engine()) as worker:
            inside = worker.call(lambda engine: openmp.thread_max_threads()).result(timeout=10)
    finally:
        torch.set_num_threads(previous)
    assert inside == wanted


def test_starting_the_engine_thread_releases_the_callers_openmp_pool(make_engine) -> None:
    """Two OpenMP pools (the loader's and the engine thread's) make libgomp throttle both: one must go."""
    import os

    import torch

    from engine.core.engine_thread import EngineThread

    openmp = _openmp_or_skip()

    def tasks() -> set[str]:
        return set(os.listdir("/proc/self/task"))

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = make_engine()
        openmp.release_thread_pool()
        before = tasks()
        torch.ones(1 << 20).add_(1)  # a parallel region: this thread gets its own worker threads
        pool = tasks() - before
        assert pool, "libgomp made no worker thread for this thread"
        with EngineThread(engine) as worker:
            worker.call(lambda engine: torch.ones(1 << 20).add_(1)).result(timeout=10)
            deadline = time.monotonic() + 60  # the old pool's threads exit soon after; a loaded machine is slow
            while pool & tasks() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not pool & tasks()
    finally:
        torch.set_num_threads(previous)


def test_a_request_with_a_sink_sends_each_event_there_once_and_keeps_none(worker) -> None:
    seen: list = []
    handle = worker.submit([5, 6, 7], params=SamplingParams(max_tokens=30, ignore_eos=True), sink=seen.extend)
    final = handle.wait(timeout=30)
    assert final.finish_reason == "length" and seen[-1] is final
    assert sum(len(e.token_ids) for e in seen) == 30 and handle.output_tokens == 30
    assert handle.pending == 0 and handle.token_ids == [] and handle.text_parts == []


def test_a_failure_while_adding_goes_to_the_requests_sink(worker, monkeypatch) -> None:
    def refuse(*_args, **_kwargs):
        raise RuntimeError("injected while adding")

    monkeypatch.setattr(worker.engine, "add_request", refuse)
    arrived = threading.Event()
    seen: list = []

    def sink(events) -> None:
        seen.extend(events)
        arrived.set()

    handle = worker.submit([5, 6, 7], params=SamplingParams(max_tokens=4), sink=sink)
    assert arrived.wait(30)
    assert [e.finish_reason for e in seen] == ["error"] and "injected while adding" in seen[0].error
    assert handle.done and handle.pending == 0
