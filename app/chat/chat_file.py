"""Reading a chat file for import, as untrusted input: a size cap before a byte is read, strict UTF-8, a nesting
limit, text that is Unicode (no lone surrogates), and every field checked for its type and range. Whatever is
refused gets one line saying which field and why; nothing is written until the whole file has passed."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from engine.domain.chat import ASSISTANT, USER, ChatMessage, ChatSettings
from engine.domain.reply_stats import KEPT
from engine.errors import StudioError
from engine.types import REPETITION_PENALTY_MAX, REPETITION_PENALTY_MIN, SEED_MAX, SEED_MIN

FORMAT = "inference-studio-chat"
VERSION = 1
MIB = 1024 * 1024
MAX_FILE_BYTES = 16 * MIB  # a chat of a few thousand long messages; the 100 MB file took 5.4 GB to read
MAX_DEPTH = 8  # the format nests 4 levels (file, messages, message, stats)
MAX_MESSAGES = 100_000


class ChatImportError(StudioError):
    """A file that is not a chat exported by the studio (or is damaged)."""


def read_chat_file(path: Path) -> dict:
    """The file's checked JSON (a dict in the chat format). Raises ChatImportError with the reason. Thread-safe: the
    window runs it in a worker thread."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            cap = MAX_FILE_BYTES // MIB
            raise ChatImportError(f"{path} is {size / MIB:.0f} MiB; a chat file may be at most {cap} MiB")
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)  # the file may have grown since stat()
    except OSError as exc:
        raise ChatImportError(f"could not read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ChatImportError(f"{path} is larger than {MAX_FILE_BYTES // MIB} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChatImportError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    return parse_chat_json(text, str(path))


def parse_chat_json(text: str, source: str = "the file") -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ChatImportError(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise ChatImportError(f"{source} is nested too deeply to be a chat") from None
    except ValueError:  # an integer past Python's 4,300-digit limit
        raise ChatImportError(f"{source} holds a number with too many digits") from None
    if not _depth_within(data, MAX_DEPTH):
        raise ChatImportError(f"{source} is nested more than {MAX_DEPTH} levels deep; a chat file nests 4")
    bad = _first_non_text(data)
    if bad is not None:
        raise ChatImportError(f"{source}: {bad} holds a lone surrogate (\\uD800-\\uDFFF), which is not text")
    check_document(data, source)
    return data


def _depth_within(value: object, limit: int) -> bool:
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return False
                stack.append((child, depth + 1))
    return True


def _first_non_text(value: object, where: str = "the file") -> str | None:
    """Where the first string (or key) that cannot be encoded as UTF-8 is, or None. Iterative."""
    stack: list[tuple[object, str]] = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            if not _is_text(item):
                return at
        elif isinstance(item, dict):
            for key, child in item.items():
                if not _is_text(key):
                    return f"a key in {at}"
                stack.append((child, f"{key!r}" if at == "the file" else f"{at}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{at}[{index + 1}]") for index, child in enumerate(item))
    return None


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ---- the schema ---------------------------------------------------------------------------------
def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _in(low: float, high: float, *, low_open: bool = False) -> Callable[[object], bool]:
    return lambda v: _number(v) and (low < v if low_open else low <= v) and v <= high


def _stats(value: object) -> bool:
    """A reply's statistics: the line under it formats each as a number."""
    return value is None or (isinstance(value, dict) and all(value.get(k) is None or _number(value.get(k))
                                                             for k in KEPT))  # fmt: skip


#: each setting the file may hold: (check, what it must be); unknown settings (a newer studio's) are ignored
SETTINGS: dict[str, tuple[Callable[[object], bool], str]] = {
    "system_prompt": (lambda v: isinstance(v, str), "text"),
    "temperature": (_in(0, 2), "a number from 0 to 2"),
    "top_p": (_in(0, 1, low_open=True), "a number above 0, at most 1"),
    "top_k": (lambda v: _integer(v) and 0 <= v <= 2**31 - 1, "a whole number, 0 or more"),
    "max_tokens": (lambda v: _integer(v) and 1 <= v <= 2**31 - 1, "a whole number, 1 or more"),
    "seed": (lambda v: v is None or (_integer(v) and SEED_MIN <= v <= SEED_MAX), "null or a 64-bit whole number"),
    "repetition_penalty": (
        _in(REPETITION_PENALTY_MIN, REPETITION_PENALTY_MAX),
        f"a number from {REPETITION_PENALTY_MIN:g} to {REPETITION_PENALTY_MAX:g}",
    ),
    "overflow": (lambda v: isinstance(v, str), "text"),
    "output": (lambda v: isinstance(v, str), "text"),
    "json_schema": (lambda v: isinstance(v, str), "text"),
    "show_tokens": (lambda v: isinstance(v, bool), "true or false"),
}
MESSAGE_FIELDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "role": (lambda v: v in (USER, ASSISTANT), "'user' or 'assistant'"),
    "content": (lambda v: isinstance(v, str), "text"),
    "stats": (_stats, "null or an object of numbers"),
    "finish_reason": (lambda v: v is None or isinstance(v, str), "null or text"),
    "error": (lambda v: v is None or isinstance(v, str), "null or text"),
    "created": (_number, "a number (seconds since 1970)"),
}


def check_document(data: object, source: str) -> None:
    """Raises ChatImportError naming the first field that is not what the format says."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ChatImportError(f'{source} is not a chat exported by Inference Studio (no "format": "{FORMAT}")')
    version = data.get("version")
    if _integer(version) and version > VERSION:
        raise ChatImportError(f"{source} was written by a newer Inference Studio; update to import it")
    if version != VERSION or not _integer(version):
        raise ChatImportError(f'{source}: "version" must be {VERSION}, not {json.dumps(version)[:40]}')
    if "title" in data and not isinstance(data["title"], str):
        raise ChatImportError(f'{source}: "title" must be text')
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        raise ChatImportError(f'{source}: "settings" must be an object')
    for name, (check, wanted) in SETTINGS.items():
        if name in settings and not check(settings[name]):
            raise ChatImportError(f'{source}: setting "{name}" must be {wanted}, not {_shown(settings[name])}')
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise ChatImportError(f"{source} has no list of messages")
    if len(messages) > MAX_MESSAGES:
        raise ChatImportError(f"{source} holds {len(messages)} messages; at most {MAX_MESSAGES} can be imported")
    for number, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            raise ChatImportError(f"{source}: message {number} must be an object")
        for name, (check, wanted) in MESSAGE_FIELDS.items():
            required = name in ("role", "content")
            if (required or name in message) and not check(message.get(name)):
                raise ChatImportError(f'{source}: message {number}\'s "{name}" must be {wanted}, not '
                                      f"{_shown(message.get(name))}")  # fmt: skip


def _shown(value: object) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."


def settings_of(data: dict) -> ChatSettings:
    """A checked file's settings (its unknown ones left out)."""
    return ChatSettings.from_dict(data.get("settings") or {})


def messages_of(data: dict) -> list[ChatMessage]:
    return [ChatMessage.from_dict(item) for item in data["messages"]]
