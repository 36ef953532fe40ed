"""The step cost model learns decode and prefill costs from steps and sizes prefill so streams never freeze."""

from __future__ import annotations

import pytest

from engine.core.config import EngineConfig
from engine.core.page_pool import PagePool
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.step_cost import StepCostModel
from engine.types import SamplingParams


def model() -> StepCostModel:
    return StepCostModel(prefill_budget_s=0.1, stall_ratio=1.0, min_tokens=16, max_tokens=256)


def test_nothing_learnt_means_the_token_budget_alone() -> None:
    cost = model()
    assert cost.prefill_token_budget(8) == 256 and cost.decode_time(8) is None


def test_decode_time_is_fitted_per_row_and_prefill_cost_per_token() -> None:
    cost = model()
    for rows in (1, 2, 4, 8, 16):
        cost.observe(rows, 0, 0.020 + 0.005 * rows)  # decode-only steps: 20 ms + 5 ms a row
    assert cost.decode_time(10) == pytest.approx(0.070)
    cost.observe(4, 200, 0.040 + 0.200)  # beside 4 decode rows, 200 prefill tokens took 200 ms: 1 ms a token
    assert cost.prefill_s_per_token == pytest.approx(0.001)
    # with 4 rows decoding (40 ms a step) a step may prefill for 100 ms: 100 tokens
    assert cost.prefill_token_budget(4) == 100
    # with 16 rows (100 ms a step) the budget is 1 x the decode step: still 100 ms
    assert cost.prefill_token_budget(16) == 100
    # nothing decodes: nobody waits, the token budget alone
    assert cost.prefill_token_budget(0) == 256
    assert cost.stall(4, 100, 0.140) == pytest.approx(0.100) and cost.stall(0, 100, 0.5) == 0.0


def test_a_slow_machine_still_makes_progress() -> None:
    cost = model()
    cost.observe(4, 0, 0.05)
    cost.observe(4, 10, 0.05 + 1.0)  # 100 ms a prefill token
    assert cost.prefill_token_budget(4) == 16  # the floor (a page), never zero


def test_the_scheduler_keeps_prefill_within_the_budget_while_streams_decode() -> None:
    pool = PagePool(64, 4)
    budgets: list[int] = []

    def budget(decode_rows: int) -> int:
        budgets.append(decode_rows)
        return 5 if decode_rows else 1000

    scheduler = Scheduler(EngineConfig(page_size=4, max_step_tokens=64), pool, prefill_tokens_for=budget)
    first = Request("a", list(range(1, 9)), SamplingParams(max_tokens=8))
    scheduler.add(first)
    out = scheduler.schedule()
    assert [c.num_tokens for c in out.chunks] == [8]  # nobody decodes yet: the whole prompt
    scheduler.commit(out.chunks[0])
    first.output_ids.append(3)  # it sampled its first token and now decodes
    scheduler.add(Request("b", list(range(1, 21)), SamplingParams(max_tokens=8)))
    out = scheduler.schedule()
    assert [(c.request.request_id, c.num_tokens) for c in out.chunks] == [("a", 1), ("b", 5)]
    assert out.prefill_allowed == 5 and budgets == [0, 1]
