"""Panel: the summary table of the last experiment run (plain rows and columns, filled by the app)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QLabel, QTableWidget, QTableWidgetItem

from widgets.dashboard.data.series import WindowView
from widgets.dashboard.panel import Panel


class ResultsPanel(Panel):
    key = "results"
    title = "Experiment results"
    explanation = "The summary of the last experiment from the Experiments menu; its steps are in the charts above."

    def build(self) -> None:
        self.heading = QLabel("Run an experiment from the Experiments menu to compare settings side by side.")
        self.heading.setWordWrap(True)
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.notes = QLabel()
        self.notes.setWordWrap(True)
        for widget in (self.heading, self.table, self.notes):
            self.body.addWidget(widget)
        self.body.addStretch(1)  # the table at the top, spare height below it

    def show_result(
        self, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str]
    ) -> None:
        self.heading.setText(f"<b>{escape(title, quote=False)}</b>")
        self.table.clear()
        self.table.setColumnCount(len(columns))
        self.table.setRowCount(len(rows))
        self.table.setHorizontalHeaderLabels(list(columns))
        for r, row in enumerate(rows):
            for c, value in enumerate(row):
                self.table.setItem(r, c, QTableWidgetItem(str(value)))
        header = self.table.horizontalHeader().sizeHint().height()  # height() is 0 until the table was shown
        scroll = self.table.horizontalScrollBar().sizeHint().height()  # room for it: a narrow dock scrolls sideways
        height = header + sum(self.table.rowHeight(r) for r in range(len(rows))) + scroll + 6
        self.table.setFixedHeight(max(60, height))
        self.notes.setText("<br>".join(escape(n, quote=False) for n in notes))

    def show_status(self, text: str) -> None:
        self.heading.setText(escape(text, quote=False))

    def cells(self) -> list[list[str]]:
        return [
            [self.table.item(r, c).text() for c in range(self.table.columnCount())]
            for r in range(self.table.rowCount())
        ]

    def refresh(self, view: WindowView) -> None:
        """The table changes only when a result arrives."""
