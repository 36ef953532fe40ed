"""EventRouter: events go to their request's receiver, grouped per receiver in order; finished routes end."""

from __future__ import annotations

from engine.core.routing import EventRouter
from engine.types import FinishReason, TokenEvent


def event(request_id: str, text: str, finished: bool = False) -> TokenEvent:
    reason = FinishReason.STOP if finished else None
    return TokenEvent(request_id, "tag", [], text, 0.0, finished=finished, finish_reason=reason)


def test_events_are_grouped_per_receiver_in_arrival_order() -> None:
    router: EventRouter[str] = EventRouter()
    router.add("a", "tab 1")
    router.add("b", "tab 2")
    router.add("c", "tab 1")  # one receiver may wait for several requests
    routed = router.route([event("a", "1"), event("b", "2"), event("c", "3"), event("x", "lost"), event("a", "4")])
    assert [(receiver, [e.text for e in events]) for receiver, events in routed] == [
        ("tab 1", ["1", "3", "4"]),
        ("tab 2", ["2"]),
    ]


def test_a_route_ends_with_its_finishing_event_unless_kept() -> None:
    router: EventRouter[str] = EventRouter()
    router.add("a", "handle")
    assert router.route([event("a", "x", finished=True)]) == [("handle", [event("a", "x", finished=True)])]
    assert router.get("a") is None and router.route([event("a", "late")]) == []

    kept: EventRouter[str] = EventRouter(keep_finished=True)
    kept.add("a", "queue")
    kept.route([event("a", "x", finished=True)])
    assert kept.get("a") == "queue" and len(kept) == 1
    assert kept.remove("a") == "queue" and len(kept) == 0
