"""Which panels to redraw on a tick, so the dashboard never takes more than a set share of the UI thread's time."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

#: the dashboard's share of the UI thread's wall time: 1.2% of the whole machine's CPU. The engine computes on
#: the same cores, and on a small machine every millisecond of drawing costs it more than that (its threads
#: wait for each other at every parallel step). On 2 slow cores each chart updates every second or two; on 8
#: fast ones all of them at the full 10 Hz.
DEFAULT_SHARE = min(0.25, 0.012 * (os.cpu_count() or 2))
STARVED_S = 4.0  # a panel waiting this long is redrawn even without credit: a chart must never look frozen
MAX_CREDIT_S = 0.1  # time saved up while idle: a few panels' worth, no more
MAX_TICK_S = 0.015  # redraws planned into one tick: more at once would stall the event loop visibly


class RedrawBudget:
    """CPU-time credit that grows with wall time at `share`; the dashboard's work spends it.

    The work of a redraw is only partly in the refresh call: Qt paints the charts and labels later, in the event
    loop. So the UI thread's CPU time between two ticks is measured, and what exceeds the usual amount between
    ticks that redrew nothing (the chats, the rest of the window) is charged to the panels redrawn just before.
    Panels are taken round-robin: on a slow machine every chart updates less often, none freezes."""

    def __init__(
        self,
        share: float = DEFAULT_SHARE,
        clock: Callable[[], float] = time.perf_counter,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.share = share
        self._clock = clock
        self._cpu = cpu
        self._last_wall = clock()
        self._tick_cpu = self._last_cpu = cpu()
        self.credit = MAX_CREDIT_S
        self.baseline_s = 0.0  # UI-thread CPU between ticks that redrew nothing
        self._costs: dict[str, float] = {}  # panel -> seconds per redraw, moving average
        self._order: list[str] = []
        self._redrawn: dict[str, float] = {}  # panels redrawn by the last tick -> their refresh seconds
        self._skip_gap = False

    @property
    def unlimited(self) -> bool:
        return self.share >= 1.0

    def cost(self, key: str) -> float:
        return self._costs.get(key, 0.0)

    def begin_tick(self) -> None:
        """Accrue credit for the wall time passed; charge the work Qt did since the last tick."""
        now, cpu = self._clock(), self._cpu()
        self.credit = min(MAX_CREDIT_S, self.credit + (now - self._last_wall) * self.share)
        self._last_wall = now
        gap = cpu - self._last_cpu
        if self._skip_gap:
            self._skip_gap = False
        elif self._redrawn:
            extra = max(0.0, gap - self.baseline_s)
            self.credit -= extra
            total = sum(self._redrawn.values())
            for key, refresh in self._redrawn.items():
                weight = refresh / total if total > 0 else 1.0 / len(self._redrawn)
                self._learn(key, refresh + extra * weight)
        else:
            self.baseline_s = 0.9 * self.baseline_s + 0.1 * gap
        self._redrawn = {}
        self._tick_cpu = cpu

    def pick(self, due: Sequence[str], starved: Sequence[str] = ()) -> list[str]:
        """The due panels to redraw now, longest-waiting first, as many as the credit and the per-tick limit
        cover (at least one whenever there is credit: a panel's cost is only known once it ran). A starved
        panel (waiting past STARVED_S) goes even without credit, one per tick."""
        for key in due:
            if key not in self._order:
                self._order.append(key)
        queue = [key for key in self._order if key in due]
        if self.unlimited:
            return queue
        picked: list[str] = []
        if self.credit <= 0 and starved:
            picked = [next(key for key in queue if key in starved)]
            self._order.remove(picked[0])
            self._order.append(picked[0])
            return picked
        planned = 0.0
        for key in queue:
            if self.credit - planned <= 0 or (picked and planned + self.cost(key) > MAX_TICK_S):
                break
            picked.append(key)
            planned += self.cost(key)
        for key in picked:  # to the back of the line
            self._order.remove(key)
            self._order.append(key)
        return picked

    def redrawn(self, key: str, refresh_s: float) -> None:
        self._redrawn[key] = self._redrawn.get(key, 0.0) + refresh_s

    def hold(self) -> None:
        """Nothing is drawn (hidden, paused): save no credit up; showing again redraws everything anyway."""
        self.credit = min(self.credit, 0.0)

    def skip_gap(self) -> None:
        """The time until the next tick is not the panels' doing alone (a window shown, a forced redraw of
        everything): neither charge it to them nor count it as the usual background."""
        self._skip_gap = True
        self._redrawn = {}

    def end_tick(self) -> None:
        """Charge this tick's own CPU time (reading snapshots, refreshing panels)."""
        self._last_cpu = self._cpu()
        self.credit -= self._last_cpu - self._tick_cpu

    def _learn(self, key: str, seconds: float) -> None:
        previous = self._costs.get(key)
        self._costs[key] = seconds if previous is None else 0.7 * previous + 0.3 * seconds
