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
from engine.errors import EngineStoppedError
from engine.handle import RequestHandle, hand_to
from engine.types import EventSink, SamplingParams, TokenEvent, new_request_id

log = logging.getLogger(__name__)


#: a loop that made no progress this long while requests wait is reported stuck (/health, waiting callers)
STUCK_AFTER_S = 120.0
#: how often a thread that died is started again before it stays down
MAX_RESTARTS = 3


class EngineThread:
    """Owns the engine: only this thread touches the model, the page pool and the scheduler. A failing step fails
    its requests; if the loop itself dies, every request still open gets an error and a new thread takes over
    (up to max_restarts times)."""

    def __init__(
        self,
        engine: Engine,
        name: str = "engine",
        *,
        stuck_after_s: float = STUCK_AFTER_S,
        max_restarts: int = MAX_RESTARTS,
    ) -> None:
        self.engine = engine
        self.name = name
        self.stuck_after_s = stuck_after_s
        self.max_restarts = max_restarts
        self.restarts = 0
        self.last_crash: str | None = None
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._handles: EventRouter[RequestHandle] = EventRouter()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.idle_wait_s = 0.05
        self._torch_threads = torch.get_num_threads()
        self._progress_at = time.monotonic()  # when the loop last made progress (or had nothing to do)
        self._in_task = False  # a call() runs: long on purpose (an experiment), not stuck
        self._adding = 0  # requests submitted whose add command has not run yet

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
        self._stopping.set()
        if not self._thread.is_alive():
            return
        self._commands.put(self._abort_all)
        self._commands.put(lambda: None)  # wake the loop
        self._thread.join(timeout)

    def __enter__(self) -> EngineThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def health(self) -> str | None:
        """None when the engine is serving; else what is wrong: its thread stopped, or it is stuck."""
        if not self.alive:
            crash = f": {self.last_crash}" if self.last_crash else ""
            return f"the engine thread has stopped{crash}"
        if self._in_task or not self.engine.has_unfinished:
            return None
        stalled = time.monotonic() - self._progress_at
        if stalled > self.stuck_after_s:
            return f"the engine has made no progress for {stalled:.0f} s while requests wait"
        return None

    def started(self, request_id: str) -> bool:
        """Whether the engine has scheduled the request at least once (a cheap read from any thread): False while it
        waits in the queue, or before it is added."""
        request = self.engine.requests.get(request_id)
        return request is not None and request.first_scheduled_time is not None

    @property
    def num_waiting(self) -> int:
        """Requests not yet running: queued in the scheduler or not yet added (a cheap read from any thread)."""
        return len(self.engine.scheduler.waiting) + self._adding

    @property
    def metrics(self):
        return self.engine.metrics

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
        sink: EventSink | None = None,
    ) -> RequestHandle:
        """Queue a request. Bad input raises here, in the caller's thread, before anything is queued. Its events
        (its failure too) go to sink when one is given, called in the engine thread with each step's events of all
        the requests that share it; else into the handle, for the caller to iterate."""
        params = params or SamplingParams()
        if not self.alive and (self._stopping.is_set() or self._thread.ident is not None):
            raise EngineStoppedError(f"the engine is not running ({self.health() or 'shut down'})")
        if prompt_ids is None:
            prompt_ids = self.engine.encode(prompt=prompt, messages=messages, raw=raw, tools=tools)
        self.engine.check_request(prompt_ids, params)
        # the grammar's matcher is made here too: its compile (or a compile again, if the cache let it go) is the
        # caller's time, never a step's
        matcher = self.engine.grammars.matcher(params.structured) if params.structured is not None else None
        request_id = request_id or new_request_id()
        handle = RequestHandle(self.cancel, request_id, len(prompt_ids), watchdog=self.health, sink=sink)
        arrival = time.monotonic()
        ids = list(prompt_ids)

        def add() -> None:
            self._adding -= 1
            self._handles.add(request_id, handle)
            try:
                self.engine.add_request(
                    ids, params, request_id=request_id, tag=tag, arrival_time=arrival, matcher=matcher, checked=True
                )
            except Exception as exc:  # validated already; anything left fails the request through its route
                self._handles.remove(request_id)
                handle.deliver(TokenEvent.failed(request_id, str(exc), tag=tag))

        self._adding += 1  # only an estimate for num_waiting: += from several threads may race
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
                self._in_task = True
                try:
                    future.set_result(fn(self.engine))
                except Exception as exc:
                    future.set_exception(exc)
                finally:
                    self._in_task = False
                    self._progress_at = time.monotonic()

        self._commands.put(run)
        return future

    # ---- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        # OpenMP thread counts are per thread and a new one starts from the runtime's default, not from
        # torch.set_num_threads: oneDNN's prepacked linears read it directly
        torch.set_num_threads(self._torch_threads)
        try:
            self._loop()
        except BaseException as exc:  # the loop's own failure handling failed, or something fatal was raised
            log.critical("the engine thread died", exc_info=True)
            self._recover(f"{type(exc).__name__}: {exc}")
            return
        self._drain_commands(block=False)
        self._abort_all()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._drain_commands(block=not self.engine.has_unfinished)
            if self._stopping.is_set():
                break
            if not self.engine.has_unfinished:
                self._progress_at = time.monotonic()
                continue
            steps = self.engine.step_count
            try:
                events = self.engine.step()
            except Exception as exc:  # a bug outside the model call: fail everything, keep the thread
                log.exception("engine step crashed")
                events = self.engine.fail_all(f"engine error: {type(exc).__name__}: {exc}")
            if events or self.engine.step_count != steps:
                self._progress_at = time.monotonic()
            if events:
                self._dispatch(events)

    def _recover(self, crash: str) -> None:
        """In the dying thread: fail every open request, make the engine consistent, start a new thread."""
        self.last_crash = crash
        message = f"the engine thread failed ({crash}); this request was lost"
        handles = dict(self._handles.drain())
        tags = {request_id: request.tag for request_id, request in self.engine.requests.items()}
        try:
            self.engine.reset_requests()
            reset = True
        except Exception:
            log.exception("the engine could not be reset; it stays down")
            reset = False
        now = time.monotonic()
        for request_id, handle in handles.items():
            handle.deliver(TokenEvent.failed(request_id, message, tag=tags.get(request_id, ""), at=now))
        if not reset or self._stopping.is_set() or self.restarts >= self.max_restarts:
            log.error("the engine thread stays down (%d restarts so far)", self.restarts)
            return
        self.restarts += 1
        log.warning("starting the engine thread again (restart %d of %d)", self.restarts, self.max_restarts)
        self._progress_at = time.monotonic()
        thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        thread.start()
        self._thread = thread  # only now: `alive` never reads a thread not yet started

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
        """Each event once, to its request's handle: queued there, or handed on to the request's sink, each sink
        once per step with all its requests' events (16 server streams: one wake-up of the server's loop)."""
        batches: dict[int, tuple[EventSink, list[TokenEvent]]] = {}
        for handle, handle_events in self._handles.route(events):
            kept = handle.take(handle_events)
            if kept and handle.sink is not None:
                batches.setdefault(id(handle.sink), (handle.sink, []))[1].extend(kept)
        for sink, batch in batches.values():
            hand_to(sink, batch)

    def _abort_all(self) -> None:
        events = [e for e in (self.engine.abort(rid) for rid in list(self.engine.requests)) if e is not None]
        if events:
            self._dispatch(events)
