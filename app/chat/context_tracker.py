"""ChatContext: keeps a chat's context meter current: the counts of what was sent, the reply as it streams, and the
KV pages the chat's requests hold or left cached."""

from __future__ import annotations

import time
from dataclasses import replace

from app.chat.context_fit import CHARS_PER_TOKEN, ContextLimits, Fit
from engine.core.metrics import PageMap
from engine.domain.reply_stats import ReplyStats
from engine.types import TokenEvent
from widgets.chat.context import ContextUsage
from widgets.chat.panel import ChatPanel

# a streaming reply's count reaches the meter at most this often (every frame re-laid out its line: ~5 % of the UI
# thread with one chat); what else changes it (sent, finished, pages) shows at once, with any count held back
STREAMING_SHOW_S = 0.25


class ChatContext:
    def __init__(self, panel: ChatPanel) -> None:
        self._panel = panel
        self.usage = ContextUsage()
        self._last_pages: tuple[int, ...] = ()  # the page table of the chat's latest request, as last published
        self._reply_chars = 0
        self._shown_at = 0.0
        self._held_back = False  # a streamed count not on the meter yet

    def _show(self, usage: ContextUsage, streaming: bool = False) -> None:
        if usage == self.usage and not self._held_back:
            return
        self.usage = usage
        now = time.monotonic()
        if streaming and now - self._shown_at < STREAMING_SHOW_S:
            self._held_back = True
            return
        self._held_back = False
        self._shown_at = now
        self._panel.set_context_usage(usage)

    def measured(self, fit: Fit, limits: ContextLimits, reply_tokens: int = 0, reply_in_prompt: bool = False) -> None:
        """Counts of a conversation as it goes (or would go) to the model. reply_in_prompt: the fit's messages end
        with the reply of reply_tokens (a chat reopened or re-counted): shown as the reply, not twice."""
        system = fit.system_tokens or 0
        earlier = reply_tokens if reply_in_prompt else 0
        self._reply_chars = 0
        self._show(
            replace(
                self.usage,
                system_tokens=system,
                history_tokens=None if fit.prompt_tokens is None else max(0, fit.prompt_tokens - system - earlier),
                reply_tokens=reply_tokens,
                context_tokens=limits.length,
                limit_note=limits.note,
                approximate=limits.approximate,
                dropped_messages=len(fit.dropped),
            )
        )

    def streamed(self, events: list[TokenEvent]) -> None:
        """A frame of the reply: token ids where the backend gives them, else about four characters a token."""
        tokens = sum(len(e.token_ids) for e in events)
        if tokens:
            self._show(replace(self.usage, reply_tokens=self.usage.reply_tokens + tokens), streaming=True)
            return
        self._reply_chars += sum(len(e.text) for e in events)
        self._show(replace(self.usage, reply_tokens=self._reply_chars // CHARS_PER_TOKEN), streaming=True)

    def finished(self, stats: ReplyStats | None) -> None:
        """The backend's own count of the request, where it reports one, replaces the estimate."""
        stats = stats or ReplyStats()
        prompt, output = stats.prompt_tokens, stats.output_tokens
        usage = replace(self.usage, pages_held=0)
        if prompt:
            usage = replace(usage, history_tokens=max(0, prompt - (usage.system_tokens or 0)))
        if output is not None:
            usage = replace(usage, reply_tokens=output)
        self._show(usage)

    def pages(self, page_map: PageMap | None, request_id: str | None) -> None:
        """Pages the chat's running request holds; between turns, those of its last request still cached."""
        if page_map is None:
            return
        held = page_map.table_of(request_id)
        if held is not None:
            self._last_pages = held
            self._show_pages(len(held), 0)
            return
        # still hashed and findable: a next turn starting with the same tokens reuses them (shared ones included)
        cached = sum(1 for page in self._last_pages if page in page_map.cached_pages)
        self._show_pages(0, cached)

    def _show_pages(self, held: int, cached: int) -> None:
        # sixteen tabs are told four times a second, mostly what they show already: nothing is rebuilt then
        if (self.usage.pages_held, self.usage.pages_cached) != (held, cached) or self._held_back:
            self._show(replace(self.usage, pages_held=held, pages_cached=cached))

    def forget_pages(self) -> None:
        """Another engine now: the old pool's pages mean nothing."""
        self._last_pages = ()
        self._show(replace(self.usage, pages_held=0, pages_cached=0))
