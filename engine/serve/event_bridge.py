"""Engine events into asyncio: the server's one event sink routes each request's events to its own asyncio.Queue."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from engine.core.engine_thread import EngineThread
from engine.core.routing import EventRouter
from engine.handle import WATCH_INTERVAL_S, RequestHandle
from engine.serve.openai_protocol import ApiError
from engine.types import EventSink, TokenEvent

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
    """Lives on one event loop. Requests are submitted with `sink`: the engine thread calls it once per step with
    that step's events of every server request, and it never blocks that thread: it only hands them to the loop
    with call_soon_threadsafe. A request's failure (while being added, or by the watchdog) comes the same way."""

    def __init__(self, worker: EngineThread, loop: asyncio.AbstractEventLoop, max_backlog: int = 256) -> None:
        self.worker = worker
        self.loop = loop
        self.max_backlog = max_backlog
        # routes stay until unregister(), so a stream sees its finishing event whichever way it ended
        self._queues: EventRouter[EventQueue] = EventRouter(keep_finished=True)
        self._streaming: dict[str, RequestHandle] = {}  # the open streams' handles, for the watchdog
        self._watchdog: asyncio.Task | None = None
        self.sink: EventSink = self._on_events  # one object: the engine thread groups each step's events per sink

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

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

    async def _watch(self) -> None:
        """One task for all streams: while any is open, ask each handle's watchdog every WATCH_INTERVAL_S; an engine
        that is stuck fails them, and their failures arrive on their queues like any event."""
        while self._streaming:
            await asyncio.sleep(WATCH_INTERVAL_S)
            for handle in list(self._streaming.values()):
                handle.check()
        self._watchdog = None

    def _watch_stream(self, handle: RequestHandle) -> None:
        self._streaming[handle.request_id] = handle
        if self._watchdog is None:
            self._watchdog = self.loop.create_task(self._watch())

    async def _first(self, handle: RequestHandle, queue: EventQueue, queue_wait_s: float | None) -> TokenEvent:
        """The first event; a request that has not started within queue_wait_s is cancelled with a 429."""
        if queue_wait_s is None:
            return await queue.get()
        try:
            return await asyncio.wait_for(queue.get(), timeout=queue_wait_s)
        except TimeoutError:
            # a long prompt being prefilled has started: it is not waiting in the queue
            if not self.worker.started(handle.request_id):
                raise queue_timeout(queue_wait_s) from None
        return await queue.get()

    async def stream(
        self, handle: RequestHandle, queue: EventQueue, queue_wait_s: float | None = None
    ) -> AsyncIterator[TokenEvent]:
        """The request's events, ending with the finishing one. If the consumer stops early (the client went
        away, the task was cancelled), the request is cancelled in the engine and its pages freed. Raises ApiError:
        429 when no event came within queue_wait_s (the request waited that long in the queue; it is cancelled),
        and when the consumer fell max_backlog events behind (it is cancelled already)."""
        self._watch_stream(handle)
        try:
            event = await self._first(handle, queue, queue_wait_s)
            while True:
                if queue.overflowed:
                    raise ApiError(
                        429,
                        f"the stream was ended: {queue.max_backlog} of its chunks waited unread (the client is not "
                        "reading it)",
                        type="rate_limit_error",
                        code="stream_not_read",
                    )
                yield event
                if event.finished:
                    return
                event = await queue.get()
        finally:
            self._streaming.pop(handle.request_id, None)
            self.unregister(handle.request_id)
            if not handle.done:
                log.info("request %s cancelled: the client went away", handle.request_id)
                handle.cancel()
