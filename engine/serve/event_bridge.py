"""Engine events into asyncio: one EngineThread listener routes each request's events to its own asyncio.Queue."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from engine.core.engine_thread import EngineThread
from engine.core.routing import EventRouter
from engine.handle import RequestHandle
from engine.serve.openai_protocol import ApiError
from engine.types import TokenEvent

log = logging.getLogger(__name__)


def queue_timeout(waited_s: float) -> ApiError:
    return ApiError(
        429,
        f"the server is busy: this request waited {waited_s:g} s in the queue without starting; retry later",
        type="rate_limit_error",
        code="queue_timeout",
        headers={"Retry-After": "1"},
    )


class EventQueue(asyncio.Queue[TokenEvent]):
    """One request's events on the loop, at most max_backlog of them unread. A stream whose client does not read
    (its socket's buffers full, the response blocked) would otherwise hold its running slot and pages while the
    engine wrote events for nobody, as many as its max_tokens: past the backlog the request is cancelled
    (on_overflow) and the stream ends with an error when the client reads again."""

    def __init__(self, request_id: str, max_backlog: int, on_overflow: Callable[[str], None]) -> None:
        super().__init__()
        self.request_id = request_id
        self.max_backlog = max_backlog
        self.on_overflow = on_overflow
        self.overflowed = False

    def offer(self, event: TokenEvent) -> None:
        if self.overflowed:
            return
        if self.qsize() >= self.max_backlog and not event.finished:
            self.overflowed = True
            log.info("request %s cancelled: %d events waited unread (the client is not reading)",
                     self.request_id, self.qsize())  # fmt: skip
            self.on_overflow(self.request_id)
            return
        self.put_nowait(event)


def _deliver(routed: list[tuple[EventQueue, list[TokenEvent]]]) -> None:
    """On the loop: every stream's events of one step into its queue."""
    for queue, queue_events in routed:
        for event in queue_events:
            queue.offer(event)


class AsyncEventBridge:
    """Lives on one event loop. The listener runs in the engine thread and never blocks it: it only hands each
    event to the loop with call_soon_threadsafe."""

    def __init__(self, worker: EngineThread, loop: asyncio.AbstractEventLoop, max_backlog: int = 256) -> None:
        self.worker = worker
        self.loop = loop
        self.max_backlog = max_backlog
        # routes stay until unregister(): a request that ends while being added reports on its handle instead
        self._queues: EventRouter[EventQueue] = EventRouter(keep_finished=True)
        worker.add_listener(self._on_events)

    def close(self) -> None:
        self.worker.remove_listener(self._on_events)

    def register(self, request_id: str) -> EventQueue:
        """Call before submitting, so no event of the request can come before its queue exists."""
        queue = EventQueue(request_id, self.max_backlog, self.worker.cancel)
        self._queues.add(request_id, queue)
        return queue

    def unregister(self, request_id: str) -> None:
        self._queues.remove(request_id)

    def _on_events(self, events: list[TokenEvent]) -> None:
        routed = self._queues.route(events)
        if not routed:
            return
        try:
            # one wake-up of the loop per step, not one per stream: with 16 streams that is 16 times fewer
            # cross-thread calls (each a pipe write, a loop wake-up and a turn at the GIL)
            self.loop.call_soon_threadsafe(_deliver, routed)
        except RuntimeError:  # the loop has closed: the server is gone, nobody is listening
            return

    async def stream(
        self, handle: RequestHandle, queue: EventQueue, poll_s: float = 1.0, queue_wait_s: float | None = None
    ) -> AsyncIterator[TokenEvent]:
        """The request's events, ending with the finishing one. If the consumer stops early (the client went
        away, the task was cancelled), the request is cancelled in the engine and its pages freed. Raises ApiError:
        429 when no event came within queue_wait_s (the request waited that long in the queue; it is cancelled),
        and when the consumer fell max_backlog events behind (it is cancelled already)."""
        started = self.loop.time()
        first = True
        try:
            while True:
                if queue.overflowed:
                    raise ApiError(
                        429,
                        f"the stream was ended: {queue.max_backlog} of its chunks waited unread (the client is not "
                        "reading it)",
                        type="rate_limit_error",
                        code="stream_not_read",
                    )
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=poll_s)
                except TimeoutError:
                    # A request that failed while being added reports only on its handle, not to listeners; one
                    # whose engine died or is stuck is failed by the handle's watchdog (check()): no endless loop.
                    if handle.check() and queue.empty() and handle.final is not None:
                        event = handle.final
                    else:
                        waited = self.loop.time() - started
                        overdue = first and queue_wait_s is not None and waited > queue_wait_s
                        # a long prompt being prefilled has started: it is not waiting in the queue
                        if overdue and not self.worker.started(handle.request_id):
                            raise queue_timeout(queue_wait_s) from None
                        continue
                first = False
                yield event
                if event.finished:
                    return
        finally:
            self.unregister(handle.request_id)
            if not handle.done:
                log.info("request %s cancelled: the client went away", handle.request_id)
                handle.cancel()
