"""How long steps take on this model and machine, learnt from the steps themselves: the time a decode step of d rows
takes, and what each prefill token adds. It sizes a step's prefill so a prompt arriving never freezes the chats
already streaming, and it measures the stall each prefill caused them."""

from __future__ import annotations

from collections import deque

EMA = 0.3  # weight of the newest prefill step in the per-token cost
WINDOW = 64  # decode-only steps the decode-time fit remembers


class StepCostModel:
    """prefill_budget_s: the time a step may spend prefilling while streams decode (at least that, or
    stall_ratio x the decode step itself when decode steps are slower), so a stream waits at most about
    (1 + stall_ratio) decode steps for its next token when a prompt arrives."""

    def __init__(self, prefill_budget_s: float, stall_ratio: float, min_tokens: int, max_tokens: int) -> None:
        self.prefill_budget_s = prefill_budget_s
        self.stall_ratio = stall_ratio
        self.min_tokens = min_tokens
        self.max_tokens = max_tokens
        self._decode_steps: deque[tuple[int, float]] = deque(maxlen=WINDOW)
        self._fit: tuple[float, float] | None = None  # decode time = a + b * rows
        self.prefill_s_per_token: float | None = None

    # ---- learning -----------------------------------------------------------------------------
    def observe(self, decode_rows: int, prefill_tokens: int, duration_s: float) -> None:
        if prefill_tokens == 0:
            if decode_rows:
                self._decode_steps.append((decode_rows, duration_s))
                self._fit = None
            return
        base = self.decode_time(decode_rows) if decode_rows else 0.0
        per_token = max(0.0, duration_s - (base or 0.0)) / prefill_tokens
        previous = self.prefill_s_per_token
        self.prefill_s_per_token = per_token if previous is None else (1 - EMA) * previous + EMA * per_token

    def decode_time(self, rows: int) -> float | None:
        """Expected seconds of a decode-only step of `rows` rows (None before any was seen)."""
        if not self._decode_steps:
            return None
        if self._fit is None:
            self._fit = _line(self._decode_steps)
        a, b = self._fit
        return max(0.0, a + b * rows)

    # ---- deciding -----------------------------------------------------------------------------
    def prefill_token_budget(self, decode_rows: int) -> int:
        """Prefill tokens this step may compute beside `decode_rows` decode rows."""
        per_token = self.prefill_s_per_token
        if decode_rows == 0 or not per_token:
            return self.max_tokens  # nobody waits, or nothing measured yet: the token budget alone
        decode = self.decode_time(decode_rows) or 0.0
        allowed = max(self.prefill_budget_s, self.stall_ratio * decode)
        return max(self.min_tokens, min(self.max_tokens, int(allowed / per_token)))

    def stall(self, decode_rows: int, prefill_tokens: int, duration_s: float) -> float:
        """How much longer the streams in this step waited for their token because of the prefill in it."""
        if not decode_rows or not prefill_tokens:
            return 0.0
        decode = self.decode_time(decode_rows)
        return max(0.0, duration_s - decode) if decode is not None else 0.0


def _line(points: deque[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares a + b*x through the points (b = 0 when every x is the same)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        return mean_y, 0.0
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in points) / var)
    return mean_y - slope * mean_x, slope
