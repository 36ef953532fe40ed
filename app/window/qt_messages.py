"""Route Qt's own warnings into Python logging, dropping the offscreen platform's harmless complaints."""

from __future__ import annotations

import logging

from PySide6.QtCore import QtMsgType, qInstallMessageHandler

log = logging.getLogger("qt")

# The offscreen platform (self-test, CI) can't do these window-manager things; nothing is wrong.
_NOISE = ("does not support propagateSizeHints", "does not support raise()", "does not support setParent")

_LEVELS = {
    QtMsgType.QtDebugMsg: logging.DEBUG,
    QtMsgType.QtInfoMsg: logging.INFO,
    QtMsgType.QtWarningMsg: logging.WARNING,
    QtMsgType.QtCriticalMsg: logging.ERROR,
    QtMsgType.QtFatalMsg: logging.CRITICAL,
}


def _handle(kind: QtMsgType, _context, message: str) -> None:
    level = logging.DEBUG if any(noise in message for noise in _NOISE) else _LEVELS.get(kind, logging.WARNING)
    log.log(level, "%s", message)


def route_qt_messages() -> None:
    qInstallMessageHandler(_handle)
