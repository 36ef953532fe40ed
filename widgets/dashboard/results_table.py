"""A read-only table whose cells wrap to the width it is given: it never scrolls sideways, and its height follows
its width (heightForWidth), so a narrow dock shows every wrapped row in full."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QAction, QFont, QFontMetricsF, QGuiApplication, QPainter, QPalette, QTextLayout, QTextOption
from PySide6.QtWidgets import QSizePolicy, QWidget

PAD_X = 6  # inside a cell, each side
PAD_Y = 3


def wrapped(text: str, font: QFont, width: float) -> QTextLayout:
    """`text` laid out in lines of at most `width`: at word boundaries, inside a word only where one does not fit."""
    layout = QTextLayout(text, font)
    option = QTextOption()
    option.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
    layout.setTextOption(option)
    layout.beginLayout()
    y = 0.0
    while True:
        line = layout.createLine()
        if not line.isValid():
            break
        line.setLineWidth(max(1.0, width))
        line.setPosition(QPointF(0, y))
        y += line.height()
    layout.endLayout()
    return layout


def layout_height(layout: QTextLayout) -> float:
    return layout.boundingRect().height()


def column_widths(natural: Sequence[float], minimum: Sequence[float], available: float) -> list[float]:
    """Column widths within `available`, the way HTML tables share width: every column its natural (unwrapped)
    width when all fit, spare width shared in proportion; else each its longest word and the rest shared by how
    much each would still like; else (too narrow even for that) the columns whose longest word fits a fair share
    keep it whole and the others share what is left, breaking inside their longest words."""
    if not natural:
        return []
    total = sum(natural)
    if total <= available:
        if total <= 0:
            return [available / len(natural)] * len(natural)
        return [n + (available - total) * n / total for n in natural]
    floor = sum(minimum)
    if floor <= available:
        wants = [n - m for n, m in zip(natural, minimum, strict=True)]
        spare = available - floor
        return [m + spare * w / sum(wants) for m, w in zip(minimum, wants, strict=True)]
    widths: list[float | None] = [None] * len(minimum)
    left = available
    while True:
        open_columns = [c for c, w in enumerate(widths) if w is None]
        share = left / sum(minimum[c] for c in open_columns)
        whole = [c for c in open_columns if share >= 1 or minimum[c] <= left / len(open_columns)]
        if not whole or len(whole) == len(open_columns):
            for c in open_columns:
                widths[c] = minimum[c] * min(1.0, share)
            return [float(w) for w in widths]  # type: ignore[arg-type]
        for c in whole:
            widths[c] = minimum[c]
            left -= minimum[c]


class ResultsTable(QWidget):
    """Header row in bold, then the rows; cells wrap within their column. Right-click copies it as text."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        policy = QSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        self._columns: list[str] = []
        self._rows: list[list[str]] = []
        self._laid_out: tuple[float, list[float], list[list[QTextLayout]], list[float]] | None = None
        copy = QAction("Copy table", self)
        copy.triggered.connect(self.copy)
        self.addAction(copy)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)

    # ---- content -----------------------------------------------------------------------------------------------
    def set_table(self, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        self._columns = [str(c) for c in columns]
        self._rows = [[str(v) for v in row] for row in rows]
        self._forget()

    def clear(self) -> None:
        self.set_table([], [])

    def columns(self) -> list[str]:
        return list(self._columns)

    def cells(self) -> list[list[str]]:
        return [list(row) for row in self._rows]

    def as_text(self) -> str:
        """Tab-separated, a line per row (pastes into a spreadsheet)."""
        return "\n".join("\t".join(row) for row in [self._columns, *self._rows])

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.as_text())

    # ---- geometry ----------------------------------------------------------------------------------------------
    def _fonts(self) -> tuple[QFont, QFont]:
        bold = QFont(self.font())
        bold.setBold(True)
        return bold, self.font()

    def _table(self) -> list[list[str]]:
        return [self._columns, *self._rows] if self._columns else []

    def _extents(self) -> tuple[list[float], list[float]]:
        """Per column: its natural width (no wrapping) and its longest word, padding included."""
        natural = [0.0] * len(self._columns)
        minimum = [0.0] * len(self._columns)
        for r, row in enumerate(self._table()):
            metrics = QFontMetricsF(self._fonts()[0 if r == 0 else 1])
            for c, text in enumerate(row[: len(natural)]):
                natural[c] = max(natural[c], metrics.horizontalAdvance(text) + 2 * PAD_X + 1)
                longest = max((metrics.horizontalAdvance(word) for word in text.split()), default=0.0)
                minimum[c] = max(minimum[c], longest + 2 * PAD_X + 1)
        return natural, minimum

    def _layout(self, width: float) -> tuple[list[float], list[list[QTextLayout]], list[float]]:
        """Column widths, each cell's wrapped text, and each row's height, for a table `width` wide (cached)."""
        if self._laid_out is not None and self._laid_out[0] == width:
            return self._laid_out[1:]
        natural, minimum = self._extents()
        widths = column_widths(natural, minimum, float(width))
        cells, heights = [], []
        for r, row in enumerate(self._table()):
            font = self._fonts()[0 if r == 0 else 1]
            line = [wrapped(text, font, widths[c] - 2 * PAD_X) for c, text in enumerate(row[: len(widths)])]
            cells.append(line)
            heights.append(max((layout_height(cell) for cell in line), default=0.0) + 2 * PAD_Y)
        self._laid_out = (width, widths, cells, heights)
        return widths, cells, heights

    def _forget(self) -> None:
        self._laid_out = None
        self.updateGeometry()
        self.update()

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        if not self._columns:
            return 0
        _, _, heights = self._layout(float(width))
        return int(sum(heights)) + 2

    def sizeHint(self) -> QSize:
        width = int(sum(self._extents()[0])) if self._columns else 0
        return QSize(width, self.heightForWidth(width))

    def minimumSizeHint(self) -> QSize:
        # narrow columns break words rather than push the dock into scrolling sideways
        width = 12 * len(self._columns)
        return QSize(width, self.heightForWidth(max(1, width)) if self._columns else 0)

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() in (event.Type.FontChange, event.Type.StyleChange):
            self._forget()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.update()

    # ---- painting ----------------------------------------------------------------------------------------------
    def paintEvent(self, event) -> None:
        if not self._columns:
            return
        widths, cells, heights = self._layout(float(self.width()))
        palette = self.palette()
        painter = QPainter(self)
        grid = palette.color(QPalette.ColorRole.Mid)
        y = 0.0
        for r, line in enumerate(cells):
            if r == 0 or r % 2 == 0:
                role = QPalette.ColorRole.Button if r == 0 else QPalette.ColorRole.AlternateBase
                painter.fillRect(QRectF(0, y, sum(widths), heights[r]), palette.color(role))
            painter.setPen(palette.color(QPalette.ColorRole.Text))
            x = 0.0
            for c, layout in enumerate(line):
                layout.draw(painter, QPointF(x + PAD_X, y + PAD_Y))
                x += widths[c]
            y += heights[r]
            painter.setPen(grid)
            painter.drawLine(QPointF(0, y), QPointF(sum(widths), y))
        painter.setPen(grid)
        painter.drawRect(QRectF(0, 0, sum(widths) - 1, y))
        x = 0.0
        for width in widths[:-1]:
            x += width
            painter.drawLine(QPointF(x, 0), QPointF(x, y))
        painter.end()
