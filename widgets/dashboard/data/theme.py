"""Dashboard colours for light and dark windows, and a stable colour per chat (plain hex strings, no Qt)."""

from __future__ import annotations

from dataclasses import dataclass

# Tableau 10, reordered so the first chats get the most distinct hues; series colours are picked apart from them.
CHAT_COLOURS = (
    "#4e79a7",
    "#e15759",
    "#59a14f",
    "#b07aa1",
    "#edc948",
    "#76b7b2",
    "#ff9da7",
    "#9c755f",
    "#f28e2b",
    "#8cd17d",
    "#499894",
    "#d37295",
)


@dataclass(frozen=True)
class Theme:
    dark: bool
    background: str
    foreground: str
    muted: str  # axis text, captions
    prefill: str
    decode: str
    other: str
    used: str
    cached_free: str
    free: str
    total: str
    admitted: str
    finished: str
    preempted: str
    page_free: str  # page map cells
    page_cached: str
    page_gap: str
    drafted: str  # accepted speculative draft tokens on the per-token chart


LIGHT = Theme(
    dark=False,
    background="#ffffff",
    foreground="#202124",
    muted="#5f6368",
    prefill="#f28e2b",
    decode="#4e79a7",
    other="#b8b8b8",
    used="#4e79a7",
    cached_free="#edc948",
    free="#e3e6ea",
    total="#202124",
    admitted="#2e8b57",
    finished="#6a3d9a",
    preempted="#d62728",
    page_free="#eceff1",
    page_cached="#f3dfa2",
    page_gap="#ffffff",
    drafted="#00897b",
)

DARK = Theme(
    dark=True,
    background="#1e1f22",
    foreground="#e8eaed",
    muted="#9aa0a6",
    prefill="#ffa94d",
    decode="#74a7e0",
    other="#6c6f75",
    used="#74a7e0",
    cached_free="#c9a227",
    free="#3a3d42",
    total="#e8eaed",
    admitted="#5cd08a",
    finished="#c39bff",
    preempted="#ff6b6b",
    page_free="#2f3237",
    page_cached="#6b5a24",
    page_gap="#1e1f22",
    drafted="#4dd0e1",
)


def chat_colour(index: int) -> str:
    return CHAT_COLOURS[index % len(CHAT_COLOURS)]


def blend(colour: str, towards: str, amount: float) -> str:
    """colour moved `amount` (0..1) of the way towards another colour."""
    a = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    b = [int(towards[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(x + (y - x) * amount) for x, y in zip(a, b, strict=True)]
    return "#" + "".join(f"{v:02x}" for v in mixed)
