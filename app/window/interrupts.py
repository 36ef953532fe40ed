"""Ctrl+C in the terminal that started the studio closes the window as Quit does (replies stopped and kept, the
window's state saved). Python runs its signal handlers only between bytecodes, and Qt's event loop waits in C++:
the signal's wake-up byte on a socket pair makes the loop turn, and the handler runs."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
from collections.abc import Callable

from PySide6.QtCore import QSocketNotifier, QTimer
from PySide6.QtWidgets import QWidget

log = logging.getLogger(__name__)


def close_on_interrupt(window: QWidget) -> Callable[[], None]:
    """Install (main thread only); returns the function that puts the previous handling back. A second Ctrl+C while
    the window closes ends the process the default way."""
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno())
    notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read, window)

    def drain() -> None:
        with contextlib.suppress(BlockingIOError):
            reader.recv(64)  # the signal numbers: Python's own handler runs as soon as this slot's bytecode does

    def interrupted(_signum, _frame) -> None:
        log.info("Ctrl+C: closing the window")
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the next one is not asked twice
        QTimer.singleShot(0, window.close)

    notifier.activated.connect(drain)
    previous = signal.signal(signal.SIGINT, interrupted)

    def restore() -> None:
        notifier.setEnabled(False)
        signal.signal(signal.SIGINT, previous)
        signal.set_wakeup_fd(previous_fd)
        reader.close()
        writer.close()

    return restore
