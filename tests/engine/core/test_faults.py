"""Faults injected into the engine thread: a listener, the detokenizer, the error path itself and the thread's own
death. Requests fail with a message, the thread lives on (or is started again), and nobody waits forever."""

from __future__ import annotations

import threading
import time

import pytest

from engine.types import SamplingParams

LONG = SamplingParams(max_tokens=100_000, ignore_eos=True)


class Fatal(BaseException):
    """Not an Exception: it escapes every `except Exception` and kills the thread it is raised in."""


@pytest.fixture
def worker(make_engine):
    from engine.core.engine_thread import EngineThread

    thread = EngineThread(make_engine()).start()
    yield thread
    thread.shutdown()


def in_engine(worker, fn) -> object:
    return worker.call(fn).result(timeout=10)


def wait_in_thread(fn, limit_s: float = 30.0) -> object:
    """Run a call that must not block forever in a helper thread; fail the test (not hang it) if it does."""
    box: list[object] = []
    helper = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    helper.start()
    helper.join(limit_s)
    assert box, f"the call was still waiting after {limit_s} s"
    return box[0]


def test_a_listener_that_raises_does_not_stop_the_streams(worker) -> None:
    calls = {"n": 0}

    def broken(_events) -> None:
        calls["n"] += 1
        raise RuntimeError("listener bug")

    params = SamplingParams(max_tokens=5, ignore_eos=True)
    worker.submit([5, 6, 7], params=params, sink=broken)
    result = worker.submit([5, 6, 7], params=params).result(timeout=30)
    assert result.finish_reason == "length" and len(result.token_ids) == 5
    assert calls["n"] >= 5 and worker.alive


def test_the_detokenizer_raising_fails_only_its_request(worker, monkeypatch) -> None:
    from engine.core.detokenizer import IncrementalDetokenizer

    original = IncrementalDetokenizer.add

    def add(self, token: int) -> str:
        if "explode" in self.stop:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return original(self, token)

    monkeypatch.setattr(IncrementalDetokenizer, "add", add)
    doomed = worker.submit([5, 6], params=SamplingParams(max_tokens=6, ignore_eos=True, stop=("explode",)))
    healthy = worker.submit([7, 8], params=SamplingParams(max_tokens=6, ignore_eos=True))
    failed = doomed.result(timeout=30)
    assert failed.finish_reason == "error" and "injected" in failed.error
    assert healthy.result(timeout=30).finish_reason == "length"  # its step-mate carried on
    assert worker.alive and in_engine(worker, lambda engine: engine.pool.num_used) == 0


def test_the_error_path_raising_still_fails_the_requests_and_the_thread_lives(worker) -> None:
    """A step fails, and giving the pages back fails too (PagePool.release raising inside the failure handling)."""

    def break_everything(engine) -> None:
        def release(pages) -> None:
            raise RuntimeError("release exploded")

        def explode(_scheduled) -> None:
            engine.fault_injector = None
            raise RuntimeError("step exploded")

        engine.pool.release = release
        engine.fault_injector = explode

    in_engine(worker, break_everything)
    handles = [worker.submit([5 + i, 6], params=SamplingParams(max_tokens=8, ignore_eos=True)) for i in range(3)]
    for handle in handles:
        result = handle.result(timeout=30)
        assert result.finish_reason == "error" and "exploded" in result.error
    assert worker.alive
    ok = worker.submit([5, 6], params=SamplingParams(max_tokens=4, ignore_eos=True)).result(timeout=30)
    assert ok.finish_reason == "length"

    def pool_state(engine) -> tuple[int, int]:
        engine.pool.check_invariants()
        return engine.pool.num_used, engine.pool.num_free

    used, free = in_engine(worker, pool_state)
    assert used == 0 and free == in_engine(worker, lambda engine: engine.pool.num_pages)


def test_a_thread_that_dies_anyway_fails_its_requests_and_is_started_again(worker) -> None:
    def kill(_scheduled) -> None:
        worker.engine.fault_injector = None
        raise Fatal("the thread is gone")

    in_engine(worker, lambda engine: setattr(engine, "fault_injector", kill))
    handle = worker.submit([5, 6, 7], params=LONG)
    result = wait_in_thread(handle.result)  # no timeout given: it must still come back
    assert result.finish_reason == "error" and "the thread is gone" in result.error
    deadline = time.monotonic() + 10
    while worker.restarts < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert worker.restarts == 1 and worker.alive and "the thread is gone" in worker.last_crash
    ok = worker.submit([5, 6], params=SamplingParams(max_tokens=4, ignore_eos=True)).result(timeout=30)
    assert ok.finish_reason == "length"
    assert worker.health() is None


def test_a_dead_thread_without_restarts_never_leaves_a_caller_waiting(make_engine) -> None:
    from engine.core.engine_thread import EngineThread
    from engine.errors import EngineStoppedError

    worker = EngineThread(make_engine(), max_restarts=0).start()
    try:
        streaming = worker.submit([5, 6, 7], params=LONG)
        next(iter(streaming.events(timeout=30)))

        def kill(_scheduled) -> None:
            raise Fatal("no more")

        worker.call(lambda engine: setattr(engine, "fault_injector", kill))
        events = wait_in_thread(lambda: list(streaming.events()))  # no timeout: ends with the failure
        assert events[-1].finished and events[-1].finish_reason == "error"
        deadline = time.monotonic() + 10
        while worker.alive and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not worker.alive and "stopped" in worker.health()
        with pytest.raises(EngineStoppedError, match="not running"):
            worker.submit([5, 6], params=SamplingParams(max_tokens=2))
    finally:
        worker.shutdown()


def test_a_stuck_step_shows_in_health_and_callers_are_released(make_engine) -> None:
    from engine.core.engine_thread import EngineThread

    worker = EngineThread(make_engine(), stuck_after_s=0.5).start()
    release = threading.Event()
    try:
        worker.call(lambda engine: setattr(engine, "fault_injector", lambda _s: release.wait(60))).result(timeout=10)
        handle = worker.submit([5, 6], params=SamplingParams(max_tokens=3, ignore_eos=True))
        deadline = time.monotonic() + 10
        while worker.health() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "no progress" in (worker.health() or "")
        result = wait_in_thread(handle.result)  # no timeout: the watchdog ends the wait
        assert result.finish_reason == "error" and "no progress" in result.error
    finally:
        worker.engine.fault_injector = None
        release.set()
    deadline = time.monotonic() + 10
    while worker.health() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.health() is None
    worker.shutdown()
