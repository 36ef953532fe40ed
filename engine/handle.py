"""RequestHandle: the caller's side of one request (its events, its result, cancel), for local and remote engines."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from engine.types import FinishReason, RequestStats, TokenEvent


@dataclass
class RequestResult:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    stats: RequestStats | None
    error: str | None
    prompt_tokens: int


class RequestHandle:
    """A submitted request: iterate it for events, or wait for the result. Cancel from any thread.

    Whoever runs the request (an engine thread, a remote client) calls deliver() with each event."""

    def __init__(self, cancel: Callable[[str], None], request_id: str, prompt_tokens: int) -> None:
        self._cancel = cancel
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._events: queue.Queue[TokenEvent] = queue.Queue()
        self._done = threading.Event()
        self.text_parts: list[str] = []
        self.token_ids: list[int] = []
        self.final: TokenEvent | None = None

    def deliver(self, event: TokenEvent) -> None:
        """Called by the runner of the request, in its own thread."""
        self.text_parts.append(event.text)
        self.token_ids.extend(event.token_ids)
        if event.finished:
            self.final = event
            self._done.set()
        self._events.put(event)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        self._cancel(self.request_id)

    def events(self, timeout: float | None = None) -> Iterator[TokenEvent]:
        """Events as they arrive, ending with the finishing one. timeout bounds the wait for each event."""
        while True:
            try:
                event = self._events.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no event for {self.request_id} within {timeout} s") from None
            yield event
            if event.finished:
                return

    __iter__ = events

    def result(self, timeout: float | None = None) -> RequestResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.request_id} did not finish within {timeout} s")
        final = self.final
        assert final is not None
        return RequestResult(
            request_id=self.request_id,
            text="".join(self.text_parts),
            token_ids=list(self.token_ids),
            finish_reason=final.finish_reason,
            stats=final.stats,
            error=final.error,
            prompt_tokens=self.prompt_tokens,
        )
