"""ReplyRouter: sends each frame's token events to the chat tab that asked for them, grouped per tab."""

from __future__ import annotations

from typing import Protocol

from engine.core.routing import EventRouter
from engine.types import EventSink, TokenEvent


class ReplyOwner(Protocol):
    def on_events(self, events: list[TokenEvent]) -> None: ...


class ReplyRouter:
    """A tab submits its reply with `sink` (the window's event pump, which brings the events to the UI thread and
    to dispatch() once per frame) and tracks its request id until the reply ends (it untracks it then)."""

    def __init__(self, sink: EventSink) -> None:
        self.sink = sink
        self._owners: EventRouter[ReplyOwner] = EventRouter(keep_finished=True)

    def track(self, request_id: str, owner: ReplyOwner) -> None:
        self._owners.add(request_id, owner)

    def untrack(self, request_id: str) -> None:
        self._owners.remove(request_id)

    def dispatch(self, events: list[TokenEvent]) -> None:
        """One call per tab per frame, with that tab's events in order; events nobody tracks are dropped."""
        for owner, owner_events in self._owners.route(events):
            owner.on_events(owner_events)

    @property
    def tracked(self) -> int:
        return len(self._owners)
