"""CompareView: one prompt, two to four targets picked from a list, and their replies side by side: each column with
its target, timings (TTFT, tokens/s), the reply in a token view and how much of it differs from the first column."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from widgets.elided_label import ElidedLabel
from widgets.tokens.token_view import TokenView

MIN_TARGETS, MAX_TARGETS = 2, 4


class ResultColumn(QFrame):
    """One target's reply: title, status (loading, waiting, writing, the timings, or the error), tokens, the diff."""

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("compareColumn")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.title = ElidedLabel(title)
        self.title.setObjectName("compareTitle")
        self.status = QLabel("waiting for its turn…")
        self.status.setObjectName("compareStatus")
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.PlainText)  # an endpoint's error text is never markup
        self.tokens = TokenView()
        self.diff = QLabel()
        self.diff.setObjectName("compareDiff")
        self.diff.setWordWrap(True)
        self.diff.setTextFormat(Qt.TextFormat.PlainText)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addWidget(self.title)
        layout.addWidget(self.status)
        layout.addWidget(self.tokens, 1)
        layout.addWidget(self.diff)

    def set_status(self, text: str, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setProperty("level", "error" if error else "")
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)


class CompareView(QWidget):
    run_requested = Signal(str, list, int)  # prompt, target keys in column order, max tokens
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("compareView")
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("One prompt for every target, e.g. “Why is the sky blue? Two sentences.”")
        self.prompt.setFixedHeight(self.prompt.fontMetrics().lineSpacing() * 3 + 16)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 4096)
        self.max_tokens.setValue(64)
        self.max_tokens.setToolTip("Longest reply of each target, in tokens")
        self.run_button = QPushButton("Compare")
        self.run_button.setDefault(True)
        self.run_button.setToolTip("Send the prompt to every target (Ctrl+Enter)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.add_button = QToolButton()
        self.add_button.setText("+ target")
        self.add_button.setToolTip(f"Compare up to {MAX_TARGETS} targets")
        self.add_button.clicked.connect(lambda: self.add_picker())
        self.note = QLabel(
            "Greedy decoding for every target, so replies differ only where the models do. Local targets run one "
            "after another (each timing is its own); remote ones at once."
        )
        self.note.setObjectName("hint")
        self.note.setWordWrap(True)
        self._choices: list[tuple[str, str]] = []
        self.pickers: list[QComboBox] = []
        self._boxes: list[QWidget] = []  # each picker with its remove button
        self._picker_row = QHBoxLayout()
        self._picker_row.setSpacing(6)
        self.columns: list[ResultColumn] = []
        self.results = QSplitter(Qt.Orientation.Horizontal)
        self.results.setChildrenCollapsible(False)

        controls = QHBoxLayout()
        controls.addLayout(self._picker_row, 1)
        controls.addWidget(self.add_button)
        controls.addWidget(QLabel("Max tokens"))
        controls.addWidget(self.max_tokens)
        controls.addWidget(self.run_button)
        controls.addWidget(self.stop_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.prompt)
        layout.addLayout(controls)
        layout.addWidget(self.note)
        layout.addWidget(self.results, 1)
        self.run_button.clicked.connect(self._run)
        self.stop_button.clicked.connect(self.stop_requested)
        QShortcut(QKeySequence("Ctrl+Return"), self, self._run)
        for _ in range(MIN_TARGETS):
            self.add_picker()

    # ---- targets ----------------------------------------------------------------------------
    def set_choices(self, choices: list[tuple[str, ...]]) -> None:
        """(key, label[, short name]) of every target there is; each picker keeps its choice where it still exists.
        A picker shows the short name (what tells targets apart: "int8 load"), its tooltip the whole label."""
        self._choices = [(c[0], c[1], c[2] if len(c) > 2 and c[2] else c[1]) for c in choices]
        for index, picker in enumerate(self.pickers):
            self._fill(picker, picker.currentData() or self._default_key(index))

    def _default_key(self, index: int) -> str | None:
        return self._choices[min(index, len(self._choices) - 1)][0] if self._choices else None

    def _fill(self, picker: QComboBox, key: str | None) -> None:
        picker.clear()
        for choice_key, label, short in self._choices:
            picker.addItem(short, choice_key)
            picker.setItemData(picker.count() - 1, label, Qt.ItemDataRole.ToolTipRole)
        found = picker.findData(key)
        picker.setCurrentIndex(found if found >= 0 else 0)
        self._tip(picker)

    @staticmethod
    def _tip(picker: QComboBox) -> None:
        picker.setToolTip(picker.currentData(Qt.ItemDataRole.ToolTipRole) or picker.currentText())

    def add_picker(self, key: str | None = None) -> QComboBox | None:
        if len(self.pickers) >= MAX_TARGETS:
            return None
        picker = QComboBox()
        picker.setObjectName("comparePicker")
        picker.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        picker.setMinimumContentsLength(14)
        picker.currentIndexChanged.connect(lambda _i, p=picker: self._tip(p))
        self._fill(picker, key or self._default_key(len(self.pickers)))
        remove = QToolButton()
        remove.setText("✕")
        remove.setToolTip("Remove this target")
        remove.setAutoRaise(True)
        box = QWidget()
        row = QHBoxLayout(box)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        row.addWidget(picker, 1)
        row.addWidget(remove)
        remove.clicked.connect(lambda: self._remove_picker(picker))
        self._picker_row.addWidget(box, 1)
        self.pickers.append(picker)
        self._boxes.append(box)
        self._sync_buttons()
        return picker

    def _remove_picker(self, picker: QComboBox) -> None:
        if len(self.pickers) <= MIN_TARGETS:
            return
        box = self._boxes.pop(self.pickers.index(picker))
        self.pickers.remove(picker)
        self._picker_row.removeWidget(box)
        box.deleteLater()
        self._sync_buttons()

    def set_targets(self, keys: list[str]) -> None:
        while len(self.pickers) < min(len(keys), MAX_TARGETS):
            self.add_picker()
        while len(self.pickers) > max(len(keys), MIN_TARGETS):
            self._remove_picker(self.pickers[-1])
        for picker, key in zip(self.pickers, keys, strict=False):
            picker.setCurrentIndex(max(0, picker.findData(key)))

    def target_keys(self) -> list[str]:
        return [p.currentData() for p in self.pickers if p.currentData()]

    def _sync_buttons(self) -> None:
        self.add_button.setEnabled(len(self.pickers) < MAX_TARGETS)

    # ---- running ----------------------------------------------------------------------------
    def _run(self) -> None:
        if self.run_button.isEnabled() and self.prompt.toPlainText().strip() and self.target_keys():
            self.run_requested.emit(self.prompt.toPlainText(), self.target_keys(), self.max_tokens.value())

    def set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        for widget in (*self.pickers, self.add_button, self.max_tokens):
            widget.setEnabled(not running)
        if not running:
            self._sync_buttons()

    def begin(self, titles: list[str], tips: list[str] | None = None) -> list[ResultColumn]:
        """Fresh columns, one per target, in order (`tips`: each target's whole name, for its title's tooltip)."""
        for column in self.columns:
            column.setParent(None)
            column.deleteLater()
        self.columns = [ResultColumn(title) for title in titles]
        for column, tip in zip(self.columns, tips or titles, strict=True):
            column.title.setToolTip(tip)
        for column in self.columns:
            self.results.addWidget(column)
        self.results.setSizes([1000] * len(self.columns))
        return self.columns
