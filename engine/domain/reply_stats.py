"""ReplyStats: what a finished reply keeps of its request's statistics, typed from the engine's RequestStats to the
line under the reply; a plain object only where it is stored or exported."""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.types import RequestStats

#: the RequestStats fields a reply keeps (its per-token latencies would bloat the store)
KEPT = ("prompt_tokens", "cached_prompt_tokens", "output_tokens", "ttft_s", "decode_tokens_per_s", "e2e_s",
        "preemptions")  # fmt: skip


@dataclass(frozen=True)
class ReplyStats:
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    output_tokens: int | None = None
    ttft_s: float | None = None
    decode_tokens_per_s: float | None = None
    e2e_s: float | None = None
    preemptions: int | None = None
    #: the reply stopped at the end of the model's context, not at its token limit
    context_full: bool = False

    @classmethod
    def of(cls, stats: RequestStats) -> ReplyStats:
        return cls(**{name: getattr(stats, name) for name in KEPT})

    @property
    def tokens_used(self) -> int:
        """Prompt and reply tokens: how much of the context the request filled."""
        return (self.prompt_tokens or 0) + (self.output_tokens or 0)

    def to_dict(self) -> dict:
        """As stored and exported: every kept number (null where unknown), context_full only when it is so."""
        out: dict = {name: getattr(self, name) for name in KEPT}
        if self.context_full:
            out["context_full"] = True
        return out

    @classmethod
    def from_dict(cls, data: object) -> ReplyStats | None:
        """Read back from the store or a file; a value that is not a finite number (a hand-edited file) is unknown."""
        if not isinstance(data, dict):
            return None
        values = {name: data[name] for name in KEPT if _number(data.get(name))}
        return cls(**values, context_full=data.get("context_full") is True)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
