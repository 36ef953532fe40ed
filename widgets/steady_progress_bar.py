"""SteadyProgressBar: a progress bar whose new value is painted with the window's next frame, not at once."""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar


class SteadyProgressBar(QProgressBar):
    """QProgressBar::setValue repaints the bar synchronously (QWidget::repaint: Qt wants a bar to move during work that
    blocks the event loop), wherever the step is a pixel or more. The status bar's KV pages and the chat's context
    meter change four times a second while replies stream, and each change painted the bar and flushed the window
    there and then: a twelfth of the UI thread's work with sixteen chats streaming (py-spy: `set_engine_state` ->
    `QWidget::repaint`). The event loop never blocks here, so a new value is painted with the next frame instead:
    updates are held while QProgressBar stores it, and enabling them again schedules one update()."""

    def setValue(self, value: int) -> None:
        if value == self.value():
            return
        held = self.updatesEnabled()
        self.setUpdatesEnabled(False)  # repaint() does nothing while updates are off
        try:
            super().setValue(value)
        finally:
            self.setUpdatesEnabled(held)  # on again: update(), painted with the next frame
