"""ChatImporter: chat files read and checked in a worker thread, the result handed to the window's thread."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.chat.export import ChatImportError, read_chat

log = logging.getLogger(__name__)


class ChatImporter(QObject):
    """start(path) reads the file off the UI thread; read(path, ChatDocument or ChatImportError) comes back in the
    thread this object lives in (a queued signal). Nothing is written here: the window stores the checked chat."""

    read = Signal(object, object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chat-import")

    def start(self, path: Path) -> Future:
        future = self._pool.submit(self._read, path)
        return future

    def _read(self, path: Path) -> None:
        try:
            result: object = read_chat(path)
        except ChatImportError as exc:
            result = exc
        except Exception as exc:  # a checker bug must not leave the user without an answer
            log.exception("reading %s for import failed", path)
            result = ChatImportError(f"{path} could not be read ({type(exc).__name__})")
        self.read.emit(path, result)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
