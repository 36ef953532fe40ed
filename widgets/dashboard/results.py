"""Panel: the summary table of the experiment run last (its title, a status line while it runs, wrapped rows)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from PySide6.QtWidgets import QLabel

from widgets.dashboard.data.series import WindowView
from widgets.dashboard.panel import Panel
from widgets.dashboard.results_table import ResultsTable


class ResultsPanel(Panel):
    key = "results"
    title = "Experiment results"
    explanation = "The summary of the last experiment from the Experiments menu; its steps are in the charts above."

    def build(self) -> None:
        self.heading = QLabel("Run an experiment from the Experiments menu to compare settings side by side.")
        self.heading.setWordWrap(True)
        self.status = QLabel()  # what the running experiment is doing, or how it ended
        self.status.setWordWrap(True)
        self.status.hide()
        self.table = ResultsTable()  # wraps its cells to the dock's width: nothing to scroll sideways
        self.table.hide()
        self.notes = QLabel()
        self.notes.setWordWrap(True)
        for widget in (self.heading, self.status, self.table, self.notes):
            self.body.addWidget(widget)
        self.body.addStretch(1)  # the table at the top, spare height below it

    def show_started(self, title: str, status: str) -> None:
        """A new experiment: its heading, and nothing of the last one's table or notes under it."""
        self.heading.setText(f"<b>{escape(title, quote=False)}</b>")
        self.table.clear()
        self.table.hide()
        self.notes.clear()
        self.show_status(status)

    def show_result(
        self, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str]
    ) -> None:
        self.heading.setText(f"<b>{escape(title, quote=False)}</b>")
        self.status.clear()
        self.status.hide()
        self.table.set_table(columns, rows)
        self.table.setVisible(bool(columns))
        self.notes.setText("<br>".join(escape(n, quote=False) for n in notes))

    def show_status(self, text: str) -> None:
        self.status.setText(escape(text, quote=False))
        self.status.setVisible(bool(text))

    def cells(self) -> list[list[str]]:
        return self.table.cells()

    def columns(self) -> list[str]:
        return self.table.columns()

    def refresh(self, view: WindowView) -> None:
        """The table changes only when a result arrives."""
