"""The redraw budget: panels take turns, and the dashboard's share of CPU time stays under its limit."""

from __future__ import annotations

import pytest

from widgets.dashboard.data.budget import MAX_CREDIT_S, RedrawBudget


class Clocks:
    """Wall time and UI-thread CPU time, both moved by hand."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0


def run_ticks(budget: RedrawBudget, clocks: Clocks, keys, ticks: int, refresh_s: float, paint_s: float, other_s=0.0):
    """Every 100 ms: a tick that redraws what the budget picks, then Qt paints it (and other work) before the next."""
    turns: list[str] = []
    for _ in range(ticks):
        clocks.wall += 0.1
        budget.begin_tick()
        picked = budget.pick(keys)
        for key in picked:
            clocks.cpu += refresh_s
            budget.redrawn(key, refresh_s)
        budget.end_tick()
        turns.extend(picked)
        clocks.cpu += paint_s * len(picked) + other_s  # the event loop paints after the tick
    return turns


def make(clocks: Clocks, share: float = 0.1) -> RedrawBudget:
    return RedrawBudget(share=share, clock=lambda: clocks.wall, cpu=lambda: clocks.cpu)


def test_expensive_panels_take_turns_within_the_share() -> None:
    clocks = Clocks()
    budget = make(clocks)
    keys = ["a", "b", "c"]
    turns = run_ticks(budget, clocks, keys, ticks=100, refresh_s=0.01, paint_s=0.04)
    assert set(turns) == set(keys)
    assert max(turns.count(k) for k in keys) - min(turns.count(k) for k in keys) <= 1  # fair turns
    spent = len(turns) * 0.05
    assert spent <= 10.0 * 0.1 + MAX_CREDIT_S + 0.05 + 1e-9  # 10 s of wall time at a 10% share
    assert budget.cost("a") == pytest.approx(0.05, rel=0.05)  # paint time is charged to the panel


def test_cheap_panels_all_redraw_every_tick() -> None:
    clocks = Clocks()
    budget = make(clocks)
    turns = run_ticks(budget, clocks, ["a", "b"], ticks=20, refresh_s=0.0005, paint_s=0.001)
    assert len(turns) == 40


def test_work_that_is_not_the_dashboard_is_not_charged_to_it() -> None:
    clocks = Clocks()
    budget = make(clocks)
    run_ticks(budget, clocks, [], ticks=30, refresh_s=0.0, paint_s=0.0, other_s=0.02)  # the chats stream
    assert budget.baseline_s == pytest.approx(0.02, rel=0.1)
    turns = run_ticks(budget, clocks, ["a"], ticks=20, refresh_s=0.001, paint_s=0.002, other_s=0.02)
    assert len(turns) == 20
    assert budget.cost("a") == pytest.approx(0.003, abs=0.002)


def test_unlimited_share_draws_everything() -> None:
    budget = RedrawBudget(share=1.0)
    budget.redrawn("a", 100.0)
    assert budget.pick(["a", "b"]) == ["a", "b"]


def test_a_skipped_gap_is_charged_to_nobody() -> None:
    clocks = Clocks()
    budget = make(clocks)
    run_ticks(budget, clocks, ["a"], ticks=5, refresh_s=0.001, paint_s=0.002)
    before = budget.cost("a")
    budget.skip_gap()  # the window was shown: a full first paint follows
    clocks.cpu += 0.5
    clocks.wall += 0.1
    budget.begin_tick()
    budget.end_tick()
    assert budget.cost("a") == before and budget.baseline_s < 0.01


def test_a_starved_panel_is_redrawn_even_without_credit() -> None:
    clocks = Clocks()
    budget = make(clocks, share=0.01)
    budget.credit = -1.0  # deep in debt
    assert budget.pick(["a", "b"]) == []
    assert budget.pick(["a", "b"], starved=["b"]) == ["b"]
