"""How much of the model's context a chat uses, and the KV pages it holds: plain data and the meter's wording."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ContextUsage:
    """What the chat's next (or current) request takes. Token counts are None until known."""

    system_tokens: int | None = None  # the system prompt, with the chat template's wrapping
    history_tokens: int | None = None  # every other message sent: earlier turns and the newest message
    reply_tokens: int = 0  # the reply being written, or the last one
    context_tokens: int | None = None  # the most the model (or its KV cache) takes in one request; None: unknown
    limit_note: str = ""  # why the limit is what it is (e.g. "the KV cache holds fewer tokens than the model")
    approximate: bool = False  # counted without the model's tokenizer (a remote model): about 4 characters a token
    pages_held: int = 0  # KV pages the chat's request holds now
    pages_cached: int = 0  # pages of its last request still cached (a next turn reuses them instead of prefilling)
    dropped_messages: int = 0  # messages left out to fit (overflow policy)

    @property
    def used(self) -> int | None:
        if self.system_tokens is None and self.history_tokens is None:
            return None
        return (self.system_tokens or 0) + (self.history_tokens or 0) + self.reply_tokens

    @property
    def fraction(self) -> float | None:
        used = self.used
        if used is None or not self.context_tokens:
            return None
        return min(1.0, used / self.context_tokens)


def _n(value: int) -> str:
    return f"{value:,}"


def describe(usage: ContextUsage) -> tuple[str, str]:
    """(one line for the meter, a tooltip with the breakdown)."""
    used = usage.used
    about = "≈" if usage.approximate else ""
    if used is None:
        line = "Context: counted when the chat is sent"
        if usage.context_tokens is None:
            line += " · context unknown"
        else:
            line += f" · model context {_n(usage.context_tokens)} tokens"
    elif usage.context_tokens is None:
        line = f"Context {about}{_n(used)} tokens used · context unknown"
    else:
        line = f"Context {about}{_n(used)} / {_n(usage.context_tokens)} tokens ({usage.fraction:.0%})"
    if usage.pages_held:
        line += f" · {usage.pages_held} KV pages held"
    elif usage.pages_cached:
        line += f" · {usage.pages_cached} KV pages cached"
    if usage.dropped_messages:
        line += f" · {usage.dropped_messages} earlier messages left out"
    tip = [
        "Tokens this chat sends to the model with each request, and what the reply adds:",
        f"  system prompt: {'–' if usage.system_tokens is None else about + _n(usage.system_tokens)}",
        f"  history and the new message: {'–' if usage.history_tokens is None else about + _n(usage.history_tokens)}",
        f"  reply: {about}{_n(usage.reply_tokens)}",
    ]
    if usage.context_tokens is None:
        tip.append("The model's context is unknown: the server does not say.")
    else:
        note = f" ({usage.limit_note})" if usage.limit_note else ""
        tip.append(f"Context: {_n(usage.context_tokens)} tokens{note}")
    if usage.approximate:
        tip.append("Counted without the model's tokenizer (about four characters a token).")
    tip.append(
        f"KV pages: {usage.pages_held} held now; {usage.pages_cached} of the last request still cached "
        "(the next turn reuses them instead of computing its prefix again)."
    )
    return line, "\n".join(tip)
