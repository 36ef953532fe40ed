"""Prompt text or chat messages to token ids, with the model's chat template unless raw."""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.tools import messages_with_tools
from engine.errors import InvalidRequestError
from engine.types import validate_messages


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(
    tokenizer,
    *,
    prompt: str | None = None,
    messages: Sequence[dict] | None = None,
    raw: bool = False,
    tools: Sequence[dict] | None = None,
) -> list[int]:
    """Token ids for a prompt or a conversation. The chat template is applied (generation prompt added)
    unless raw is set or the model has none; tools are shown to the model as its template does, or in a system
    prompt where the template has no place for them (core/tools.py)."""
    if messages is None:
        if prompt is None or not prompt.strip():
            raise InvalidRequestError("the prompt is empty")
        if raw or not has_chat_template(tokenizer):
            return list(tokenizer(prompt).input_ids)
        messages = [{"role": "user", "content": prompt}]
    messages = validate_messages(messages)
    if not any(m["content"].strip() or m.get("tool_calls") for m in messages):
        raise InvalidRequestError("the prompt is empty")
    native_tools = False
    if tools:
        messages, native_tools = messages_with_tools(messages, tools, tokenizer)
    if raw or not has_chat_template(tokenizer):
        text = "\n".join(m["content"] for m in messages)
        return list(tokenizer(text).input_ids)
    extra = {"tools": list(tools)} if native_tools else {}
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def eos_token_ids(tokenizer, model) -> set[int]:
    ids: set[int] = set()
    generation = getattr(model, "generation_config", None)
    for source in (getattr(tokenizer, "eos_token_id", None), getattr(generation, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return ids
