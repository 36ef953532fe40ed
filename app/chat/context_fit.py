"""Fitting a conversation into the model's context by the chat's overflow policy, and what limits a backend has."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.domain.chat import USER, ChatMessage, OverflowPolicy

log = logging.getLogger(__name__)

Counter = Callable[[list[dict]], int]
Encoder = Callable[[list[dict]], list[int]]
CHARS_PER_TOKEN = 4  # a rough rule for text in English, for backends whose tokenizer is not here
REPLY_SHARE = 4  # a policy that drops history keeps room for a reply of max_tokens, at most a quarter of the context


def approximate_count(messages: list[dict]) -> int:
    """Tokens of a message list without the model's tokenizer: about four characters a token, a few per message."""
    return sum(len(m.get("content") or "") // CHARS_PER_TOKEN + 4 for m in messages) + 3


@dataclass(frozen=True)
class ContextLimits:
    """What a backend says of its context. length None: unknown (a remote server that does not say)."""

    length: int | None
    count: Counter = approximate_count
    approximate: bool = True
    note: str = ""
    #: the backend's own tokenizer, where it is here: the fit's prompt ids are then sent as they are, so a send
    #: encodes the conversation once (with sixteen tabs sending at once, each encode is UI time the engine waits for)
    encode: Encoder | None = None


def limits_for(backend) -> ContextLimits:
    """The local engine knows its context and tokenizer exactly; a remote client, at most its context length."""
    engine = getattr(backend, "engine", None)
    if engine is not None:
        length, note = engine.context_length, ""
        if engine.pool_tokens < length:
            length, note = engine.pool_tokens, f"the KV cache holds {engine.pool_tokens:,} of the model's {length:,}"

        def encode(messages: list[dict]) -> list[int]:
            return engine.encode(messages=messages)

        return ContextLimits(length, lambda messages: len(encode(messages)), False, note, encode=encode)
    length = getattr(backend, "context_length", None)
    request = getattr(backend, "request_context_length", None)
    if length is None and request is not None:
        request()  # asked once, in the background; the meter says "context unknown" until it answers
    return ContextLimits(length if isinstance(length, int) else None)


@dataclass
class Fit:
    """What goes to the model: the messages (system prompt first), the chat indices left out, and the counts."""

    messages: list[dict]
    dropped: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    system_tokens: int | None = None
    fits: bool = True
    reason: str = ""
    newest_fits: bool = True  # the system prompt and the newest turn alone leave room (dropping history would help)
    prompt_ids: list[int] | None = None  # the messages encoded by the backend's own tokenizer, where it is here


def _turns(messages: Sequence[ChatMessage]) -> list[list[int]]:
    """Indices of the messages that go to the model, grouped into turns: a user message and what follows it."""
    turns: list[list[int]] = []
    for index, message in enumerate(messages):
        if not message.in_context:
            continue
        if message.role == USER or not turns:
            turns.append([index])
        else:
            turns[-1].append(index)
    return turns


def _as_dicts(system_prompt: str, messages: Sequence[ChatMessage], keep: list[int]) -> list[dict]:
    out = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    out.extend({"role": messages[i].role, "content": messages[i].content} for i in keep)
    return out


def _safe_count(limits: ContextLimits, messages: list[dict]) -> int:
    try:
        return limits.count(messages)
    except Exception:  # a tokenizer without a chat template, say: the rough count rather than no meter
        log.debug("counting tokens failed; using the approximate count", exc_info=True)
        return approximate_count(messages)


def _counted(limits: ContextLimits, messages: list[dict]) -> tuple[int, list[int] | None]:
    """The token count, and the ids where the backend's tokenizer is here."""
    if limits.encode is None:
        return _safe_count(limits, messages), None
    try:
        ids = list(limits.encode(messages))
    except Exception:  # as _safe_count: the rough count, and the backend encodes the messages itself
        log.debug("encoding the conversation failed; using the approximate count", exc_info=True)
        return approximate_count(messages), None
    return len(ids), ids


def fit_conversation(
    system_prompt: str, messages: Sequence[ChatMessage], limits: ContextLimits, policy: OverflowPolicy, max_tokens: int
) -> Fit:
    """The messages to send for the chat's next reply. `stop` sends everything while the prompt fits; the other
    policies drop whole turns (never the system prompt or the newest message) until a reply has room too."""
    turns = _turns(messages)
    everything = [i for turn in turns for i in turn]
    system_tokens = _safe_count(limits, _as_dicts(system_prompt, [], [])) if system_prompt.strip() else 0
    if limits.length is None:
        full = _as_dicts(system_prompt, messages, everything)
        tokens, ids = _counted(limits, full)
        return Fit(full, [], tokens, system_tokens, prompt_ids=ids)
    if policy not in tuple(OverflowPolicy) or policy == OverflowPolicy.STOP:
        droppable: list[list[int]] = []
        room = 1  # the prompt must leave the reply at least one token; the reply then stops at the context's end
    else:
        protected = 1 if policy == OverflowPolicy.TRUNCATE_MIDDLE else 0  # the first exchange stays when truncating
        droppable = turns[protected:-1]
        room = max(1, min(max_tokens, limits.length // REPLY_SHARE))

    def attempt(k: int) -> Fit:
        gone = {i for turn in droppable[:k] for i in turn}
        keep = [i for i in everything if i not in gone]
        sent = _as_dicts(system_prompt, messages, keep)
        tokens, ids = _counted(limits, sent)
        return Fit(sent, sorted(gone), tokens, system_tokens, tokens + room <= limits.length, prompt_ids=ids)

    best = attempt(0)
    if not best.fits and turns:
        alone = _safe_count(limits, _as_dicts(system_prompt, messages, turns[-1]))
        best.newest_fits = alone + max(1, min(max_tokens, limits.length // REPLY_SHARE)) <= limits.length
    if best.fits or not droppable:
        return _with_reason(best, policy, limits.length)
    low, high = 1, len(droppable)  # fewest turns dropped that fit: dropping more only ever shortens the prompt
    newest_fits = best.newest_fits
    best = attempt(high)
    while low < high:
        middle = (low + high) // 2
        trial = attempt(middle)
        if trial.fits:
            best, high = trial, middle
        else:
            low = middle + 1
    if not best.fits:
        best = attempt(len(droppable))
    best.newest_fits = newest_fits
    return _with_reason(best, policy, limits.length)


def _with_reason(fit: Fit, policy: OverflowPolicy, length: int) -> Fit:
    if fit.dropped:
        what = "truncated the middle" if policy == OverflowPolicy.TRUNCATE_MIDDLE else "rolling window"
        fit.reason = f"{what} to fit the model's context of {length:,} tokens"
    return fit


def overflow_message(fit: Fit, limits: ContextLimits, policy: OverflowPolicy) -> str:
    """Why nothing was sent, and what the user can do."""
    used = f"{fit.prompt_tokens:,}" if fit.prompt_tokens is not None else "more"
    if not fit.newest_fits:  # no policy helps: the message itself is too long
        return (
            f"Not sent: the newest message and the system prompt alone leave no room for a reply in the model's "
            f"context of {limits.length:,} tokens (the conversation is {used} tokens); shorten it (or the system "
            "prompt), or lower Max tokens."
        )
    if policy == OverflowPolicy.STOP:
        return (
            f"Not sent: this conversation ({used} tokens) no longer fits the model's context of {limits.length:,} "
            "tokens. Choose “truncate the middle” or “rolling window” under When full in the chat settings, "
            "or start a new chat."
        )
    return (
        f"Not sent: even with earlier turns left out, the system prompt and the newest message ({used} tokens) "
        f"leave no room for a reply in the model's context of {limits.length:,} tokens. Shorten them, or lower "
        "Max tokens."
    )
