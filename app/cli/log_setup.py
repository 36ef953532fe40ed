"""Logging for every command: one line per record, Python warnings through logging, and a warning that repeats
(a library's advice at every step) shown once and then only at 10, 100, 1000, ... repeats, with its count."""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


class RepeatedWarningFilter(logging.Filter):
    """Passes a WARNING-or-worse record the first time its text comes from its logger; repeats are counted and
    pass again only when the count reaches a power of ten, as one line saying so. Remembers the last max_kinds
    texts (a flood of distinct messages cannot grow it without end)."""

    def __init__(self, max_kinds: int = 1024) -> None:
        super().__init__()
        self.max_kinds = max_kinds
        self._counts: OrderedDict[tuple[str, int, str], int] = OrderedDict()
        self._lock = threading.Lock()  # records come from the engine, server and UI threads

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        text = record.getMessage()
        key = (record.name, record.levelno, text)
        with self._lock:
            count = self._counts.pop(key, 0) + 1
            self._counts[key] = count
            if len(self._counts) > self.max_kinds:
                self._counts.popitem(last=False)
        if count == 1:
            return True
        if math.log10(count).is_integer():
            # one line, no traceback: the first occurrence carried it
            record.msg, record.args = f"{text} [repeated: {count} times so far; shown again at {count * 10}]", None
            record.exc_info = record.exc_text = record.stack_info = None
            return True
        return False


def configure_logging(verbose: bool) -> RepeatedWarningFilter | None:
    """The studio's logging for this process: a stderr handler with the repeat filter, and Python warnings through
    it. Left alone when logging is configured already (a test runner, a program that embeds the studio): the filter
    goes only on the handler made here, never on someone else's."""
    root = logging.getLogger()
    if root.handlers:
        return None
    repeats = RepeatedWarningFilter()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(repeats)
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    # warnings.warn goes through logging, so the filter sees it too: Python's own once-per-place rule does not hold
    # (every warnings.catch_warnings() in a library resets it: bitsandbytes' cast warning came 41,580 times)
    logging.captureWarnings(True)
    return repeats
