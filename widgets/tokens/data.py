"""Token entries as plain data (text, and where known its log-probability and the alternatives the model weighed),
words for texts without tokens, and a diff of two sequences; no Qt here."""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from enum import StrEnum

from engine.types import Alternative, TokenLogprob

__all__ = ["Alternative", "TokenEntry", "TokenKind", "describe", "diff_flags", "entries_from_logprobs", "split_words"]


class TokenKind(StrEnum):
    """What one entry of a token view is: a model's token, a stream's piece of text (a remote without tokens), or a
    word (a text split for a diff)."""

    TOKEN = "token"
    CHUNK = "chunk"
    WORD = "word"

    @property
    def label(self) -> str:
        return "streamed text" if self is TokenKind.CHUNK else self.value


@dataclass(frozen=True)
class TokenEntry:
    """One token of a reply (or one piece of text, where the source gives no tokens: a remote's stream chunk, a
    word). `logprob` and `alternatives` are None/empty until an engine reports them (the OpenAI logprobs fields)."""

    text: str
    logprob: float | None = None
    alternatives: tuple[Alternative, ...] = ()
    token_ids: tuple[int, ...] = ()
    kind: TokenKind = TokenKind.TOKEN

    @property
    def probability(self) -> float | None:
        return None if self.logprob is None else math.exp(self.logprob)

    @property
    def unit(self) -> Hashable:
        """What a diff compares: the token ids where known, else the text."""
        return self.token_ids or self.text


def entries_from_logprobs(logprobs: Iterable[TokenLogprob]) -> list[TokenEntry]:
    """Token entries from a stream's per-token log probabilities (a TokenEvent's `logprobs`, local or remote)."""
    return [
        TokenEntry(
            lp.text,
            lp.logprob,
            lp.top,
            (lp.token_id,) if lp.token_id >= 0 else (),
        )
        for lp in logprobs
    ]


_WORD = re.compile(r"\s*\S+|\s+")


def split_words(text: str) -> list[TokenEntry]:
    """Words with the whitespace before them (so the pieces join back into the text)."""
    return [TokenEntry(piece, kind=TokenKind.WORD) for piece in _WORD.findall(text)]


def diff_flags(a: Sequence[Hashable], b: Sequence[Hashable]) -> tuple[list[bool], list[bool]]:
    """For each item of a and of b: whether it is outside what the two have in common (difflib's matching blocks)."""
    a_flags, b_flags = [True] * len(a), [True] * len(b)
    for block in SequenceMatcher(a=list(a), b=list(b), autojunk=False).get_matching_blocks():
        for k in range(block.size):
            a_flags[block.a + k] = False
            b_flags[block.b + k] = False
    return a_flags, b_flags


def _shown(text: str) -> str:
    return repr(text)[1:-1] if text.strip() != text or not text else text


def describe(entry: TokenEntry) -> str:
    """The hover text of an entry: what it is, its probability and the alternatives, or that they are unknown."""
    what = entry.kind.label
    ids = f"  (id {', '.join(map(str, entry.token_ids))})" if entry.token_ids else ""
    lines = [f"{what} “{_shown(entry.text)}”{ids}"]
    if entry.probability is not None:
        lines.append(f"probability {entry.probability:.1%} (log-probability {entry.logprob:.3f})")
        for alt in entry.alternatives:
            lines.append(f"  or “{_shown(alt.text)}”: {math.exp(alt.logprob):.1%}")
    elif entry.kind is TokenKind.TOKEN:
        lines.append("no probabilities reported for this token")
    return "\n".join(lines)
