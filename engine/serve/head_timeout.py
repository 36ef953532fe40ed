"""uvicorn's h11 protocol with a deadline for each request's head: a connection that sends no complete request line
and headers within the deadline (of connecting, or of its last response) is closed. uvicorn has no such option
(its keep-alive timer starts only after a response, and any byte received cancels it: uvicorn issue #157), so an
idle or trickling socket stayed open for good; the body's deadline is guards.BodyLimit's."""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

#: the largest request head h11 buffers (its own default, set explicitly): a larger one is a 400 and the end of the
#: connection
MAX_HEAD_BYTES = 16 * 1024


def h11_with_head_deadline(timeout_s: float) -> type[H11Protocol]:
    """The protocol class to give uvicorn.Config(http=...)."""

    class HeadDeadlineProtocol(H11Protocol):
        _head_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_deadline()  # the next request's head, on a kept-alive connection

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None
            super().connection_lost(exc)

        def _arm_head_deadline(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
            # a request head makes a new cycle: the same cycle at the deadline means no head came meanwhile
            self._head_deadline = self.loop.call_later(timeout_s, self._head_overdue, self.cycle)

        def _head_overdue(self, cycle_when_armed) -> None:
            self._head_deadline = None
            waiting = self.cycle is cycle_when_armed and (self.cycle is None or self.cycle.response_complete)
            if waiting and not self.transport.is_closing():
                log.info("closing a connection from %s: no request head within %g s", self.client, timeout_s)
                self.transport.close()

    return HeadDeadlineProtocol
