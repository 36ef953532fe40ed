"""Export a chat as Markdown or JSON, and import the JSON back, refusing malformed files with a clear message."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.chat.chat_file import (
    FORMAT,
    VERSION,
    ChatImportError,
    messages_of,
    parse_chat_json,
    read_chat_file,
    settings_of,
)
from engine.domain.chat import ASSISTANT, USER, ChatMessage, ChatSettings, format_stats

__all__ = ["ChatDocument", "ChatImportError", "from_json", "read_chat", "to_json", "to_markdown"]


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
    """A chat from an exported file's text, every field checked (chat_file.py); raises ChatImportError."""
    return document_of(parse_chat_json(text, source))


def read_chat(path: Path) -> ChatDocument:
    """A chat from an exported file, size-capped and checked before anything is written; raises ChatImportError.
    Thread-safe: the window runs it off its thread."""
    return document_of(read_chat_file(path))


def document_of(data: dict) -> ChatDocument:
    title = data.get("title")
    return ChatDocument(title.strip() if isinstance(title, str) and title.strip() else "Imported chat",
                        settings_of(data), messages_of(data))  # fmt: skip
