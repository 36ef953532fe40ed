"""How long a remote model's context is, where its server says: vLLM's model card (max_model_len), llama.cpp's
/props (n_ctx), TGI's /info (max_total_tokens), or the context fields other OpenAI-compatible servers add."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

# model-card fields, in order of trust: vLLM, LM Studio, OpenRouter-style servers
_CARD_FIELDS = ("max_model_len", "max_context_length", "context_length", "context_window")


def _positive_int(value) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def from_model_list(payload, model: str | None) -> int | None:
    """The context length in a /v1/models answer, for `model` (or the only model listed)."""
    cards = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(cards, list):
        return None
    chosen = [c for c in cards if isinstance(c, dict) and (model is None or c.get("id") == model)]
    if not chosen and len(cards) == 1 and isinstance(cards[0], dict):
        chosen = cards  # a server with one model that names it differently (llama.cpp: the file's path)
    for card in chosen:
        for name in _CARD_FIELDS:
            if (length := _positive_int(card.get(name))) is not None:
                return length
        meta = card.get("meta")  # llama.cpp: the context its server runs with (not n_ctx_train, the model's own)
        if isinstance(meta, dict) and (length := _positive_int(meta.get("n_ctx"))) is not None:
            return length
    return None


def from_props(payload) -> int | None:
    """llama.cpp's /props: the context each of its slots has (the server's --ctx-size divided among them)."""
    if not isinstance(payload, dict):
        return None
    settings = payload.get("default_generation_settings")
    if isinstance(settings, dict) and (length := _positive_int(settings.get("n_ctx"))) is not None:
        return length
    return _positive_int(payload.get("n_ctx"))


def from_info(payload) -> int | None:
    """TGI's /info: the most tokens (prompt + reply) one request may take."""
    return _positive_int(payload.get("max_total_tokens")) if isinstance(payload, dict) else None


async def fetch_context_length(
    get: Callable[[str], Awaitable[httpx.Response]], base_url: str, root_url: str, model: str | None
) -> int | None:
    """Asks the places a server may say it, in turn; None when none does (or the server can't be reached)."""
    for url, read in (
        (f"{base_url}/models", lambda p: from_model_list(p, model)),
        (f"{root_url}/props", from_props),
        (f"{root_url}/info", from_info),
    ):
        try:
            response = await get(url)
            if response.status_code != 200:
                continue
            length = read(response.json())
        except Exception:  # unreachable, not JSON, an odd shape: try the next place
            continue
        if length is not None:
            return length
    return None
