"""EventRouter: token events sent on by request id to whoever waits for them, grouped per receiver."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Generic, TypeVar

from engine.types import TokenEvent

Receiver = TypeVar("Receiver")


class EventRouter(Generic[Receiver]):
    """Receivers by request id (a handle, a queue, a chat tab; any object). Thread-safe. A route ends by itself
    with its request's finishing event, unless keep_finished is set."""

    def __init__(self, keep_finished: bool = False) -> None:
        self._routes: dict[str, Receiver] = {}
        self._lock = threading.Lock()
        self._keep_finished = keep_finished

    def add(self, request_id: str, receiver: Receiver) -> None:
        with self._lock:
            self._routes[request_id] = receiver

    def remove(self, request_id: str) -> Receiver | None:
        with self._lock:
            return self._routes.pop(request_id, None)

    def get(self, request_id: str) -> Receiver | None:
        with self._lock:
            return self._routes.get(request_id)

    def drain(self) -> list[tuple[str, Receiver]]:
        """Take every route out at once (the engine thread died: each receiver gets a failure instead)."""
        with self._lock:
            routes, self._routes = list(self._routes.items()), {}
        return routes

    def __len__(self) -> int:
        return len(self._routes)

    def route(self, events: Iterable[TokenEvent]) -> list[tuple[Receiver, list[TokenEvent]]]:
        """Each receiver with its events, in order of first arrival; events nobody waits for are dropped."""
        grouped: dict[int, tuple[Receiver, list[TokenEvent]]] = {}
        with self._lock:
            for event in events:
                receiver = self._routes.get(event.request_id)
                if receiver is None:
                    continue
                grouped.setdefault(id(receiver), (receiver, []))[1].append(event)
                if event.finished and not self._keep_finished:
                    del self._routes[event.request_id]
        return list(grouped.values())
