"""bench-ui's figures: phases with the dashboard shown or hidden, and the report made of them (Qt-free)."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field

STALL_TICK_MS = 20


@dataclass
class Phase:
    dashboard: str  # "visible" or "hidden"
    tokens: int
    wall_s: float
    ui_cpu_s: float  # CPU time of the UI thread during the phase
    stall_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class BenchReport:
    model: str
    chats: int
    phases: int
    phase_seconds: float
    stall_p50_ms: float
    stall_p99_ms: float
    stall_max_ms: float
    hidden_stall_p99_ms: float
    visible_tokens_per_s: float
    hidden_tokens_per_s: float
    ratio: float  # median over each visible phase of its rate / the mean of the hidden phases beside it
    ratio_quartiles: tuple[float, float]  # the spread of those per-phase ratios: how noisy the machine was
    ui_busy_visible: float
    ui_busy_hidden: float
    panel_cost_ms: dict[str, float] = field(default_factory=dict)
    phase_rates: list[tuple[str, float]] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"model: {self.model}; {self.chats} chats streaming; {self.phases} phases of {self.phase_seconds:g} s, "
            "dashboard (every panel) shown and hidden in turn",
            f"event-loop stall (lateness of a {STALL_TICK_MS} ms timer), dashboard shown: p50 {self.stall_p50_ms:.1f} "
            f"ms, p99 {self.stall_p99_ms:.1f} ms, max {self.stall_max_ms:.1f} ms (target p99 < 50 ms); "
            f"hidden: p99 {self.hidden_stall_p99_ms:.1f} ms",
            f"engine throughput: shown {self.visible_tokens_per_s:.1f} tok/s, hidden {self.hidden_tokens_per_s:.1f} "
            f"tok/s, ratio {self.ratio:.3f} (target >= 0.95; per-phase ratios' quartiles "
            f"{self.ratio_quartiles[0]:.2f}–{self.ratio_quartiles[1]:.2f})",
            f"UI thread busy: shown {self.ui_busy_visible:.1%}, hidden {self.ui_busy_hidden:.1%}",
            "panel redraw cost: " + ", ".join(f"{k} {v:.1f} ms" for k, v in self.panel_cost_ms.items() if v),
        ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values) or [0.0]
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summarize(phases: list[Phase], model: str, args: argparse.Namespace) -> BenchReport:
    visible = [p for p in phases if p.dashboard == "visible"]
    hidden = [p for p in phases if p.dashboard == "hidden"]
    stalls = [s for p in visible for s in p.stall_ms]
    # each shown phase against the hidden phases right before and after it: slow drifts cancel out
    ratios = []
    for i, phase in enumerate(phases):
        if phase.dashboard != "visible":
            continue
        beside = [phases[j].tokens_per_s for j in (i - 1, i + 1) if 0 <= j < len(phases)]
        if beside and statistics.mean(beside) > 0:
            ratios.append(phase.tokens_per_s / statistics.mean(beside))

    def busy(group: list[Phase]) -> float:
        return sum(p.ui_cpu_s for p in group) / sum(p.wall_s for p in group) if group else 0.0

    return BenchReport(
        model=model,
        chats=args.chats,
        phases=len(phases),
        phase_seconds=args.phase_seconds,
        stall_p50_ms=percentile(stalls, 50),
        stall_p99_ms=percentile(stalls, 99),
        stall_max_ms=max(stalls, default=0.0),
        hidden_stall_p99_ms=percentile([s for p in hidden for s in p.stall_ms], 99),
        visible_tokens_per_s=statistics.median(p.tokens_per_s for p in visible) if visible else 0.0,
        hidden_tokens_per_s=statistics.median(p.tokens_per_s for p in hidden) if hidden else 0.0,
        ratio=statistics.median(ratios) if ratios else 0.0,
        ratio_quartiles=(percentile(ratios, 25), percentile(ratios, 75)),
        ui_busy_visible=busy(visible),
        ui_busy_hidden=busy(hidden),
        phase_rates=[(p.dashboard, round(p.tokens_per_s, 1)) for p in phases],
    )
