"""BackgroundCall: run a slow function (an estimate, a network check) off the UI thread; the answer is a signal."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from engine.errors import StudioError

log = logging.getLogger(__name__)


class BackgroundCall(QObject):
    """Only the newest call's answer is delivered: a user who changes the inputs again makes older answers moot."""

    succeeded = Signal(object)
    failed = Signal(str)
    _answer = Signal(int, bool, object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._generation = 0
        self.running = False
        self._answer.connect(self._deliver)

    def run(self, fn: Callable[[], object]) -> None:
        self._generation += 1
        generation = self._generation
        self.running = True

        def work() -> None:
            try:
                result = fn()
            except StudioError as exc:
                self._answer.emit(generation, False, str(exc))
            except Exception as exc:  # the message is shown to the user; the trace goes to the log
                log.debug("background call failed", exc_info=True)
                self._answer.emit(generation, False, f"{type(exc).__name__}: {exc}")
            else:
                self._answer.emit(generation, True, result)

        threading.Thread(target=work, name="background-call", daemon=True).start()

    def _deliver(self, generation: int, ok: bool, value: object) -> None:
        if generation != self._generation:
            return
        self.running = False
        if ok:
            self.succeeded.emit(value)
        else:
            self.failed.emit(str(value))
