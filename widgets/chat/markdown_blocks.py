"""Split Markdown into prose and fenced code blocks, so code gets its own monospace view with a copy button."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

# A fence opens with ``` or ~~~ (three or more), optionally indented up to three spaces, then an info string.
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")


class SegmentKind(StrEnum):
    PROSE = "prose"  # Markdown
    CODE = "code"  # a fenced block, shown in monospace with a copy button
    PLAIN = "user"  # the user's own text, shown as typed


@dataclass(frozen=True)
class Segment:
    kind: SegmentKind
    text: str
    language: str = ""
    closed: bool = True  # False for a code block whose closing fence has not streamed in yet


def split_markdown(text: str) -> list[Segment]:
    """Prose and code segments in order. An unclosed fence runs to the end (a reply still streaming)."""
    segments: list[Segment] = []
    prose: list[str] = []
    code: list[str] = []
    fence = ""
    language = ""
    for line in text.split("\n"):
        if not fence:
            match = _FENCE.match(line)
            if match:
                if prose:
                    segments.append(Segment(SegmentKind.PROSE, "\n".join(prose)))
                    prose = []
                fence, language = match.group(1), match.group(2)
                continue
            prose.append(line)
            continue
        stripped = line.strip()
        # a closing fence uses the same character, at least as many, and nothing after it
        if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
            segments.append(Segment(SegmentKind.CODE, "\n".join(code), language))
            code, fence, language = [], "", ""
            continue
        code.append(line)
    if fence:
        segments.append(Segment(SegmentKind.CODE, "\n".join(code), language, closed=False))
    elif prose:
        segments.append(Segment(SegmentKind.PROSE, "\n".join(prose)))
    return [s for s in segments if s.kind is SegmentKind.CODE or s.text.strip()]


def code_blocks(text: str) -> list[str]:
    return [s.text for s in split_markdown(text) if s.kind is SegmentKind.CODE]
