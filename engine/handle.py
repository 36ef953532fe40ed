"""RequestHandle: the caller's side of one request (its events, its result, cancel), for local and remote engines."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from engine.types import EventSink, FinishReason, RequestStats, TokenEvent

log = logging.getLogger(__name__)

#: how often a wait asks the watchdog whether whoever runs the request is still able to finish it
WATCH_INTERVAL_S = 1.0

# None while the runner is healthy, else why it cannot finish the request (its thread died, it is stuck)
Watchdog = Callable[[], str | None]


@dataclass
class RequestResult:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    stats: RequestStats | None
    error: str | None
    prompt_tokens: int


def hand_to(sink: EventSink, events: list[TokenEvent]) -> None:
    """Give a sink its events; a sink that raises is logged and never stops whoever runs the requests."""
    try:
        sink(events)
    except Exception:
        log.exception("event sink failed")


class RequestHandle:
    """A submitted request: iterate it for events, or wait for the result. Cancel from any thread.

    Each event of the request takes one route: into this handle's queue (the caller iterates it, or waits for the
    result), or, when the request was submitted with a sink, on to that sink (a window's event pump, a server's
    event bridge), and then the handle keeps nothing but its final event and a token count, so memory stays
    bounded for requests nobody iterates. Failures take the same route as tokens.

    Whoever runs the request (an engine thread, a remote client) calls deliver() or take() with its events. Waits
    without a timeout still end: every WATCH_INTERVAL_S they ask the watchdog, and a runner that died or is stuck
    fails the request with its reason."""

    def __init__(
        self,
        cancel: Callable[[str], None],
        request_id: str,
        prompt_tokens: int,
        watchdog: Watchdog | None = None,
        sink: EventSink | None = None,
    ) -> None:
        self._cancel = cancel
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._watchdog = watchdog
        self.sink = sink
        self._events: queue.Queue[TokenEvent] | None = queue.Queue() if sink is None else None
        self._done = threading.Event()
        self._lock = threading.Lock()  # the runner and a watchdog may end the request at once
        self.text_parts: list[str] = []  # kept only for a handle without a sink (result() joins them)
        self.token_ids: list[int] = []
        self.output_tokens = 0  # counted either way
        self.final: TokenEvent | None = None

    def deliver(self, event: TokenEvent) -> None:
        """Called by the runner of the request, in its own thread (or by fail()). Events after the final one are
        dropped."""
        kept = self.take([event])
        if kept:
            assert self.sink is not None
            hand_to(self.sink, kept)

    def take(self, events: list[TokenEvent]) -> list[TokenEvent]:
        """Record events (those after the final one are dropped). Without a sink they are queued for the caller and
        nothing is returned; with one they are returned for the runner to hand on (the engine thread gives each sink
        all of one step's events in one call)."""
        kept: list[TokenEvent] = []
        with self._lock:
            for event in events:
                if self.final is not None:
                    break
                self.output_tokens += len(event.token_ids)
                if event.finished:
                    self.final = event
                if self._events is None:
                    kept.append(event)
                else:
                    self.text_parts.append(event.text)
                    self.token_ids.extend(event.token_ids)
                    self._events.put(event)
            if self.final is not None:
                self._done.set()
        return kept

    @property
    def pending(self) -> int:
        """Events queued and not yet read by the caller (always 0 with a sink: nothing is queued)."""
        return 0 if self._events is None else self._events.qsize()

    def fail(self, reason: str) -> None:
        """End the request with an error on the caller's side (its runner cannot), and ask the runner to drop it."""
        self.deliver(TokenEvent.failed(self.request_id, reason))
        with contextlib.suppress(Exception):  # the runner is gone: there is nothing left to cancel
            self.cancel()

    def check(self) -> bool:
        """Ask the watchdog; fail the request if its runner cannot finish it. True when the request is done."""
        if not self.done and self._watchdog is not None:
            reason = self._watchdog()
            if reason is not None:
                self.fail(reason)
        return self.done

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        self._cancel(self.request_id)

    def _next_event(self, timeout: float | None) -> TokenEvent:
        if self._events is None:
            raise RuntimeError(f"{self.request_id} was submitted with a sink: its events went there")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = WATCH_INTERVAL_S if deadline is None else min(WATCH_INTERVAL_S, deadline - time.monotonic())
            try:
                return self._events.get(timeout=max(0.0, wait))
            except queue.Empty:
                pass
            if self.check() and not self._events.empty():
                continue  # the watchdog just failed it: its final event is queued
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no event for {self.request_id} within {timeout} s")

    def events(self, timeout: float | None = None) -> Iterator[TokenEvent]:
        """Events as they arrive, ending with the finishing one. timeout bounds the wait for each event; without
        one, the wait still ends when the runner dies or is stuck (the watchdog)."""
        while True:
            event = self._next_event(timeout)
            yield event
            if event.finished:
                return

    __iter__ = events

    def wait(self, timeout: float | None = None) -> TokenEvent:
        """The final event, once the request ended (with or without a sink). timeout bounds the wait; without one,
        the watchdog still ends it (see events())."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = WATCH_INTERVAL_S if deadline is None else deadline - time.monotonic()
            if self._done.wait(max(0.0, min(WATCH_INTERVAL_S, remaining))) or self.check():
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self.request_id} did not finish within {timeout} s")
        final = self.final
        assert final is not None
        return final

    def result(self, timeout: float | None = None) -> RequestResult:
        """The whole reply (for a handle without a sink). timeout bounds the wait; without one, the watchdog still
        ends it (see events())."""
        if self._events is None:
            raise RuntimeError(f"{self.request_id} was submitted with a sink: its text went there")
        final = self.wait(timeout)
        return RequestResult(
            request_id=self.request_id,
            text="".join(self.text_parts),
            token_ids=list(self.token_ids),
            finish_reason=final.finish_reason,
            stats=final.stats,
            error=final.error,
            prompt_tokens=self.prompt_tokens,
        )
