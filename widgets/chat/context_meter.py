"""ContextMeter: a thin bar and one line under the message box: context used of the model's, KV pages held."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QWidget

from widgets.chat.context import ContextUsage, describe
from widgets.elided_label import ElidedLabel
from widgets.steady_progress_bar import SteadyProgressBar

WARN_FROM = 0.85  # the bar turns to the warning colour this close to the end of the context


class ContextMeter(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("contextMeter")
        self.bar = SteadyProgressBar()
        self.bar.setObjectName("contextBar")
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setFixedSize(72, 8)
        self.label = ElidedLabel()
        self.label.setObjectName("contextText")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(8)
        layout.addWidget(self.bar)
        layout.addWidget(self.label, 1)
        self.usage = ContextUsage()
        self._shown: tuple[str, str, int | None, str] | None = None  # (line, tip, bar value, level) on screen
        self.set_usage(self.usage)

    @property
    def text(self) -> str:
        self._catch_up()
        return self.label.text()

    def set_usage(self, usage: ContextUsage) -> None:
        """Shown at once where the meter is on screen; a background tab's waits until its tab is shown (sixteen
        streaming tabs restyled their bars and rebuilt their tooltips a few times a second each: a sixth of the
        UI thread's work)."""
        self.usage = usage
        if self.window().isVisible() and not self.isVisible():
            return  # showEvent catches up, once
        self._catch_up()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._catch_up()

    def _catch_up(self) -> None:
        line, tip = describe(self.usage)
        fraction = self.usage.fraction
        value = None if fraction is None else int(fraction * 1000)
        level = "warn" if fraction is not None and fraction >= WARN_FROM else ""
        shown = self._shown or ("", "", -1, "-")
        self._shown = (line, tip, value, level)
        if line != shown[0]:
            self.label.setText(line)
        if tip != shown[1]:
            self.setToolTip(tip)
            self.label.setToolTip(tip)
        if value != shown[2]:
            self.bar.setVisible(value is not None)
            self.bar.setValue(value or 0)
        if level != shown[3]:
            self.bar.setProperty("level", level)
            self.bar.style().unpolish(self.bar)  # the style sheet colours the bar by its level
            self.bar.style().polish(self.bar)
