"""What the API server accepts: caps on bodies, JSON depth, messages, stop strings and the waiting queue, and the
Host names it answers to."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.serve.http_server import is_loopback

MIB = 1024 * 1024
#: the names a loopback-bound server answers to: a page elsewhere cannot make a browser send these (DNS rebinding)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class ServeLimits:
    """Every request is checked against these before the engine sees it; the defaults fit any model's context."""

    max_body_bytes: int = 4 * MIB  # 413 above (a 128k-token prompt is about 0.5 MiB of text)
    max_json_depth: int = 32  # OpenAI's bodies nest 5 levels; 400 above
    max_messages: int = 1024
    max_prompt_chars: int = 1_000_000  # all message text together, or the completion prompt
    max_stop: int = 16  # stop strings per request (OpenAI allows 4)
    max_stop_chars: int = 256  # characters per stop string
    max_waiting: int = 256  # API requests waiting for their first token; 429 with Retry-After above
    #: seconds an API request may wait in the queue before it starts; then 429 (queue_timeout), and it is dropped
    max_queue_wait_s: int = 120
    #: chunks a stream may have waiting unread (its client not reading); then it is ended and its slot freed
    stream_backlog: int = 256
    body_timeout_s: int = 30  # a request's whole body arrives within this after its head, or 408 and the end of it
    retry_after_s: int = 1

    def check(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")


def allowed_hosts_for(bind_host: str, extra: Sequence[str] = ()) -> tuple[str, ...] | None:
    """The Host names a server bound to bind_host answers to, or None for any. Bound to loopback: the loopback
    names and the user's own (Ollama does the same against DNS rebinding). Bound elsewhere: any, unless the user
    listed names."""
    if is_loopback(bind_host) or extra:
        return (*LOOPBACK_NAMES, *(h.strip().lower() for h in extra if h.strip()))
    return None


def json_depth_within(value: object, limit: int) -> bool:
    """Whether a parsed JSON value nests no deeper than limit (a scalar is depth 0). Iterative: no recursion."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True


def _is_text(value: str) -> bool:
    """Whether a string is Unicode text: JSON lets a body spell a lone surrogate ("\\ud800"), which no UTF-8
    encoder, tokenizer or response can take."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def lone_surrogate_field(body: object) -> tuple[bool, str | None]:
    """(found, the top-level field it is under) for the first string or key of a parsed body holding a lone
    surrogate; (False, None) when there is none. Iterative: no recursion."""
    stack: list[tuple[object, str | None]] = [(body, None)]
    while stack:
        item, field = stack.pop()
        if isinstance(item, str):
            if not _is_text(item):
                return True, field
        elif isinstance(item, dict):
            for key, value in item.items():
                under = key if field is None and item is body else field
                if not _is_text(key):
                    return True, field
                stack.append((value, under))
        elif isinstance(item, list):
            stack.extend((value, field) for value in item)
    return False, None
