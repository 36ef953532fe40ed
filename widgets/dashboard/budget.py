"""Which panels to redraw on a tick, so the dashboard never takes more than a set share of the UI thread's time."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

#: the dashboard's share of wall time; the engine computes on the same cores, and a chart that updates a few
#: times a second on a slow machine is better than a slower engine (on a fast one it is 10 Hz anyway)
DEFAULT_SHARE = 0.06
MAX_CREDIT_S = 0.25  # time saved up while idle: enough to redraw everything at once after a pause, no more


class RedrawBudget:
    """Time credit that grows with wall time at `share`; each panel redraw (refresh plus paint) spends its cost.

    Panels are taken round-robin, so when the credit is short every panel still gets its turn: a slow machine
    sees every chart update less often, never some charts frozen. Costs are learned per panel (moving average)
    from what refreshing and painting actually took."""

    def __init__(self, share: float = DEFAULT_SHARE, clock: Callable[[], float] = time.perf_counter) -> None:
        self.share = share
        self._clock = clock
        self._last = clock()
        self.credit = MAX_CREDIT_S
        self._parts: dict[tuple[str, str], float] = {}  # (panel, "refresh" or "paint") -> moving average
        self._order: list[str] = []

    @property
    def unlimited(self) -> bool:
        return self.share >= 1.0

    def pick(self, due: Sequence[str]) -> list[str]:
        """The due panels to redraw now, oldest turn first, as many as the credit covers (at least one if any
        credit is left: a panel's cost is only known after it ran)."""
        now = self._clock()
        self.credit = min(MAX_CREDIT_S, self.credit + (now - self._last) * self.share)
        self._last = now
        for key in due:
            if key not in self._order:
                self._order.append(key)
        queue = [key for key in self._order if key in due]
        if self.unlimited:
            return queue
        picked: list[str] = []
        planned = 0.0
        for key in queue:
            if self.credit - planned <= 0:
                break
            picked.append(key)
            planned += self.cost(key)
        for key in picked:  # to the back of the line
            self._order.remove(key)
            self._order.append(key)
        return picked

    def cost(self, key: str) -> float:
        """Expected seconds to redraw the panel: refresh plus paint."""
        return self._parts.get((key, "refresh"), 0.0) + self._parts.get((key, "paint"), 0.0)

    def spent(self, key: str, seconds: float, part: str = "refresh") -> None:
        """A panel took `seconds` to refresh, or to paint (paints arrive after pick(), from the event loop)."""
        self.credit -= seconds
        previous = self._parts.get((key, part))
        self._parts[(key, part)] = seconds if previous is None else 0.7 * previous + 0.3 * seconds
