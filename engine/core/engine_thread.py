"""EngineThread: runs Engine.step() in a background thread; thread-safe submit and cancel; streams events."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import torch

from engine.core import openmp
from engine.core.engine import Engine
from engine.core.routing import EventRouter
from engine.handle import RequestHandle
from engine.types import EventListener, FinishReason, SamplingParams, TokenEvent, new_request_id

log = logging.getLogger(__name__)


class EngineThread:
    """Owns the engine: only this thread touches the model, the page pool and the scheduler."""

    def __init__(self, engine: Engine, name: str = "engine") -> None:
        self.engine = engine
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._handles: EventRouter[RequestHandle] = EventRouter()
        self._listeners: list[EventListener] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.idle_wait_s = 0.05
        self._torch_threads = torch.get_num_threads()

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self) -> EngineThread:
        """Start the thread. The caller (which built the engine) hands its OpenMP pool back: two pools make
        libgomp throttle both (engine.core.openmp), so the caller should leave torch work to this thread."""
        self._torch_threads = torch.get_num_threads()
        self._thread.start()
        openmp.release_thread_pool()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel everything still running and stop the thread."""
        if not self._thread.is_alive():
            return
        self._commands.put(self._abort_all)
        self._stopping.set()
        self._commands.put(lambda: None)  # wake the loop
        self._thread.join(timeout)

    def __enter__(self) -> EngineThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def metrics(self):
        return self.engine.metrics

    def add_listener(self, listener: EventListener) -> None:
        """Called in the engine thread with each step's events; must return quickly."""
        self._listeners.append(listener)

    def remove_listener(self, listener: EventListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # ---- requests ---------------------------------------------------------------------------
    def submit(
        self,
        prompt_ids: Sequence[int] | None = None,
        *,
        prompt: str | None = None,
        messages: Sequence[dict] | None = None,
        raw: bool = False,
        params: SamplingParams | None = None,
        tag: str = "",
        request_id: str | None = None,
        tools: Sequence[dict] | None = None,
    ) -> RequestHandle:
        """Queue a request. Bad input raises here, in the caller's thread, before anything is queued."""
        params = params or SamplingParams()
        if prompt_ids is None:
            prompt_ids = self.engine.encode(prompt=prompt, messages=messages, raw=raw, tools=tools)
        self.engine.check_request(prompt_ids, params)
        request_id = request_id or new_request_id()
        handle = RequestHandle(self.cancel, request_id, len(prompt_ids))
        arrival = time.monotonic()
        ids = list(prompt_ids)

        def add() -> None:
            self._handles.add(request_id, handle)
            try:
                self.engine.add_request(ids, params, request_id=request_id, tag=tag, arrival_time=arrival)
            except Exception as exc:  # validated already; anything left is reported on the handle
                self._handles.remove(request_id)
                now = time.monotonic()
                handle.deliver(TokenEvent(request_id, tag, [], "", now, True, FinishReason.ERROR, None, str(exc)))

        self._commands.put(add)
        return handle

    def cancel(self, request_id: str) -> None:
        """Stop a request within one step and free its pages. Unknown or finished ids are harmless."""

        def abort() -> None:
            event = self.engine.abort(request_id)
            if event is not None:
                self._dispatch([event])

        self._commands.put(abort)

    def call(self, fn: Callable[[Engine], object]) -> Future:
        """Run fn(engine) in the engine thread between steps."""
        future: Future = Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(self.engine))
                except Exception as exc:
                    future.set_exception(exc)

        self._commands.put(run)
        return future

    # ---- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        # OpenMP thread counts are per thread and a new one starts from the runtime's default, not from
        # torch.set_num_threads: oneDNN's prepacked linears read it directly
        torch.set_num_threads(self._torch_threads)
        while not self._stopping.is_set():
            self._drain_commands(block=not self.engine.has_unfinished)
            if self._stopping.is_set():
                break
            if not self.engine.has_unfinished:
                continue
            try:
                events = self.engine.step()
            except Exception as exc:  # a bug outside the model call: fail everything, keep the thread
                log.exception("engine step crashed")
                events = self.engine.fail_all(f"engine error: {type(exc).__name__}: {exc}")
            if events:
                self._dispatch(events)
        self._drain_commands(block=False)
        self._abort_all()

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=self.idle_wait_s) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                command()
            except Exception:
                log.exception("engine command failed")
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _dispatch(self, events: list[TokenEvent]) -> None:
        for handle, handle_events in self._handles.route(events):
            for event in handle_events:
                handle.deliver(event)
        for listener in list(self._listeners):
            try:
                listener(events)
            except Exception:
                log.exception("event listener failed")

    def _abort_all(self) -> None:
        events = [e for e in (self.engine.abort(rid) for rid in list(self.engine.requests)) if e is not None]
        if events:
            self._dispatch(events)
