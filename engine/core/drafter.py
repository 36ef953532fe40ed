"""Prompt-lookup drafts for speculative decoding: the tokens that followed the latest earlier occurrence of the
sequence's last few tokens (replies that repeat their prompt, as edits and quotes do, are found there), with the
draft length adapted per request to how many of its drafts were accepted."""

from __future__ import annotations

from dataclasses import dataclass

MAX_NGRAM = 3
MIN_NGRAM = 1
SEARCH_WINDOW = 4096  # tokens looked back through; older context rarely pays for the search


def lookup(tokens: list[int], length: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to `length` tokens that followed the latest earlier occurrence of the longest suffix n-gram found."""
    total = len(tokens)
    lowest = max(0, total - SEARCH_WINDOW)
    for n in range(min(max_ngram, total - 1), min_ngram - 1, -1):
        pattern = tokens[total - n :]
        first = pattern[0]
        # the latest start before the suffix itself, scanning backwards
        for start in range(total - n - 1, lowest - 1, -1):
            if tokens[start] == first and tokens[start : start + n] == pattern:
                follow = tokens[start + n : start + n + length]
                if follow:
                    return follow
    return []


@dataclass
class DraftState:
    """A request's draft length: longer while its drafts are accepted, shorter, then paused, while they are not."""

    length: int = 4
    paused_steps: int = 0
    misses: int = 0

    def learn(self, drafted: int, accepted: int, max_length: int) -> None:
        if accepted == drafted:
            self.length = min(max_length, self.length + 2)
            self.misses = 0
        elif accepted == 0:
            self.length = max(1, self.length // 2)
            self.misses += 1
            if self.misses >= 2:  # nothing to look up here for now (free text): stop paying for verification
                self.paused_steps, self.misses = 8, 0
        else:
            self.length = max(1, min(max_length, accepted + 1))
            self.misses = 0


class Drafter:
    """Draft tokens for decoding requests, per request state kept until the request ends."""

    def __init__(self, max_length: int = 8) -> None:
        self.max_length = max_length
        self._states: dict[str, DraftState] = {}

    def propose(self, request_id: str, tokens: list[int]) -> list[int]:
        state = self._states.setdefault(request_id, DraftState(length=min(4, self.max_length)))
        if state.paused_steps:
            state.paused_steps -= 1
            return []
        return lookup(tokens, state.length)

    def learn(self, request_id: str, drafted: int, accepted: int) -> None:
        state = self._states.get(request_id)
        if state is not None and drafted:
            state.learn(drafted, accepted, self.max_length)

    def forget(self, request_id: str) -> None:
        self._states.pop(request_id, None)
