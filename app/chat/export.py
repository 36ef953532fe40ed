"""Export a chat as Markdown or JSON, and import the JSON back, refusing malformed files with a clear message."""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.errors import StudioError
from widgets.chat.data import ASSISTANT, USER, ChatMessage, ChatSettings, format_stats

FORMAT = "inference-studio-chat"
VERSION = 1


class ChatImportError(StudioError):
    """A file that is not a chat exported by the studio (or is damaged)."""


@dataclass
class ChatDocument:
    title: str
    settings: ChatSettings
    messages: list[ChatMessage]


def to_json(chat: ChatDocument) -> str:
    return json.dumps(
        {
            "format": FORMAT,
            "version": VERSION,
            "title": chat.title,
            "settings": chat.settings.to_dict(),
            "messages": [m.to_dict() for m in chat.messages],
        },
        indent=2,
        ensure_ascii=False,
    )


def to_markdown(chat: ChatDocument) -> str:
    lines = [f"# {chat.title}", ""]
    if chat.settings.system_prompt.strip():
        lines += ["**System:**", "", chat.settings.system_prompt.strip(), ""]
    for message in chat.messages:
        lines += [f"## {'You' if message.role == USER else 'Assistant'}", "", message.content.rstrip(), ""]
        if message.error:
            lines += [f"> Error: {message.error}", ""]
        stats = format_stats(message) if message.role == ASSISTANT else ""
        if stats:
            lines += [f"*{stats}*", ""]
    return "\n".join(lines).rstrip() + "\n"


def from_json(text: str, source: str = "the file") -> ChatDocument:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ChatImportError(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ChatImportError(f'{source} is not a chat exported by Inference Studio (no "format": "{FORMAT}")')
    if data.get("version", 0) > VERSION:
        raise ChatImportError(f"{source} was written by a newer Inference Studio; update to import it")
    raw_messages = data.get("messages")
    if not isinstance(raw_messages, list):
        raise ChatImportError(f"{source} has no list of messages")
    messages = []
    for number, item in enumerate(raw_messages, 1):
        if not isinstance(item, dict) or item.get("role") not in (USER, ASSISTANT):
            raise ChatImportError(f"{source}: message {number} needs a role of 'user' or 'assistant'")
        if not isinstance(item.get("content"), str):
            raise ChatImportError(f"{source}: message {number} has no text content")
        messages.append(ChatMessage.from_dict(item))
    settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
    try:
        chat_settings = ChatSettings.from_dict(settings)
    except TypeError:
        chat_settings = ChatSettings()
    title = data.get("title") if isinstance(data.get("title"), str) and data.get("title").strip() else "Imported chat"
    return ChatDocument(title, chat_settings, messages)
