"""ContextMeter: a thin bar and one line under the message box: context used of the model's, KV pages held."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QWidget

from widgets.chat.context import ContextUsage, describe
from widgets.elided_label import ElidedLabel

WARN_FROM = 0.85  # the bar turns to the warning colour this close to the end of the context


class ContextMeter(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("contextMeter")
        self.bar = QProgressBar()
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
        self.set_usage(self.usage)

    @property
    def text(self) -> str:
        return self.label.text()

    def set_usage(self, usage: ContextUsage) -> None:
        self.usage = usage
        line, tip = describe(usage)
        self.label.setText(line)
        self.setToolTip(tip)
        self.label.setToolTip(tip)
        fraction = usage.fraction
        self.bar.setVisible(fraction is not None)
        self.bar.setValue(int((fraction or 0.0) * 1000))
        self.bar.setProperty("level", "warn" if fraction is not None and fraction >= WARN_FROM else "")
        self.bar.style().unpolish(self.bar)  # the style sheet colours the bar by its level
        self.bar.style().polish(self.bar)
