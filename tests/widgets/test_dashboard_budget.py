"""The redraw budget: panels take turns, and the dashboard's share of time stays under its limit."""

from __future__ import annotations

from widgets.dashboard.budget import MAX_CREDIT_S, RedrawBudget


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_panels_take_turns_when_credit_is_short() -> None:
    clock = Clock()
    budget = RedrawBudget(share=0.1, clock=clock)
    keys = ["a", "b", "c"]
    assert budget.pick(keys) == keys  # saved-up credit, costs unknown: everything once
    for key in keys:
        budget.spent(key, 0.1)
    turns = []
    for _ in range(30):
        clock.now += 0.1
        picked = budget.pick(keys)
        turns.extend(picked)
        for key in picked:
            budget.spent(key, 0.02, "refresh")
            budget.spent(key, 0.08, "paint")
    assert set(turns) == {"a", "b", "c"}
    assert max(turns.count(k) for k in keys) - min(turns.count(k) for k in keys) <= 1  # fair turns
    assert sum(0.1 for _ in turns) <= 3.0 * 0.1 + MAX_CREDIT_S + 0.1 + 1e-9  # share of 3 s of wall time


def test_cheap_panels_all_redraw_every_tick() -> None:
    clock = Clock()
    budget = RedrawBudget(share=0.1, clock=clock)
    for _ in range(10):
        clock.now += 0.1
        picked = budget.pick(["a", "b"])
        assert picked == ["a", "b"] or picked == ["b", "a"]
        for key in picked:
            budget.spent(key, 0.001)
    assert budget.cost("a") == 0.001


def test_unlimited_share_draws_everything() -> None:
    budget = RedrawBudget(share=1.0)
    budget.spent("a", 100.0)
    assert budget.pick(["a", "b"]) == ["a", "b"]
