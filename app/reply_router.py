"""ReplyRouter: sends each frame's token events to the chat tab that asked for them, grouped per tab."""

from __future__ import annotations

from typing import Protocol

from engine.engine import TokenEvent


class ReplyOwner(Protocol):
    def on_events(self, events: list[TokenEvent]) -> None: ...


class ReplyRouter:
    def __init__(self) -> None:
        self._owners: dict[str, ReplyOwner] = {}

    def track(self, request_id: str, owner: ReplyOwner) -> None:
        self._owners[request_id] = owner

    def untrack(self, request_id: str) -> None:
        self._owners.pop(request_id, None)

    def dispatch(self, events: list[TokenEvent]) -> None:
        """One call per tab per frame, with that tab's events in order; events nobody tracks are dropped."""
        grouped: dict[int, tuple[ReplyOwner, list[TokenEvent]]] = {}
        for event in events:
            owner = self._owners.get(event.request_id)
            if owner is not None:
                grouped.setdefault(id(owner), (owner, []))[1].append(event)
        for owner, owner_events in grouped.values():
            owner.on_events(owner_events)

    @property
    def tracked(self) -> int:
        return len(self._owners)
