"""Engine events into asyncio: one EngineThread listener routes each request's events to its own asyncio.Queue."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from engine.core.engine_thread import EngineThread
from engine.core.routing import EventRouter
from engine.handle import RequestHandle
from engine.types import TokenEvent

log = logging.getLogger(__name__)


def _deliver(routed: list[tuple[asyncio.Queue[TokenEvent], list[TokenEvent]]]) -> None:
    """On the loop: every stream's events of one step into its queue."""
    for queue, queue_events in routed:
        for event in queue_events:
            queue.put_nowait(event)


class AsyncEventBridge:
    """Lives on one event loop. The listener runs in the engine thread and never blocks it: it only hands each
    event to the loop with call_soon_threadsafe."""

    def __init__(self, worker: EngineThread, loop: asyncio.AbstractEventLoop) -> None:
        self.worker = worker
        self.loop = loop
        # routes stay until unregister(): a request that ends while being added reports on its handle instead
        self._queues: EventRouter[asyncio.Queue[TokenEvent]] = EventRouter(keep_finished=True)
        worker.add_listener(self._on_events)

    def close(self) -> None:
        self.worker.remove_listener(self._on_events)

    def register(self, request_id: str) -> asyncio.Queue[TokenEvent]:
        """Call before submitting, so no event of the request can come before its queue exists."""
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
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
        self, handle: RequestHandle, queue: asyncio.Queue[TokenEvent], poll_s: float = 1.0
    ) -> AsyncIterator[TokenEvent]:
        """The request's events, ending with the finishing one. If the consumer stops early (the client went
        away, the task was cancelled), the request is cancelled in the engine and its pages freed."""
        try:
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=poll_s)
                except TimeoutError:
                    # A request that failed while being added reports only on its handle, not to listeners; one
                    # whose engine died or is stuck is failed by the handle's watchdog (check()): no endless loop.
                    if handle.check() and queue.empty() and handle.final is not None:
                        event = handle.final
                    else:
                        continue
                yield event
                if event.finished:
                    return
        finally:
            self.unregister(handle.request_id)
            if not handle.done:
                log.info("request %s cancelled: the client went away", handle.request_id)
                handle.cancel()
