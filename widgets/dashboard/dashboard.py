"""DashboardWidget: polls metrics snapshots on a timer and redraws the visible panels for the chosen time window."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QMenu,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine.remote.metrics import RemoteMetricsSnapshot
from widgets.dashboard.data.budget import DEFAULT_SHARE, STARVED_S, RedrawBudget
from widgets.dashboard.data.export import export_csv, export_json
from widgets.dashboard.data.series import MemoryInfo, MetricsHistory, SnapshotSource
from widgets.dashboard.kv_pages import KVPagesPanel
from widgets.dashboard.numbers import NumbersPanel
from widgets.dashboard.page_map import PageMapPanel
from widgets.dashboard.panel import Panel, contained, theme_for
from widgets.dashboard.prefill_decode import PrefillDecodePanel
from widgets.dashboard.remote import RemotePanel
from widgets.dashboard.results import ResultsPanel
from widgets.dashboard.streaming import StreamingPanel
from widgets.dashboard.throughput import ThroughputPanel
from widgets.elided_label import ElidedLabel

WINDOWS = {"last 30 s": 30.0, "last 2 min": 120.0, "last 10 min": 600.0}
POLL_MS = 100  # 10 Hz: smooth enough to watch tokens arrive, cheap enough to leave on
HIDDEN_POLL_MS = 1000  # hidden: keep reading so nothing falls out of the engine's ring buffer, draw nothing
IDLE_REDRAW_S = 1.0  # with no new records, scroll the time axis only this often

# panels in reading order; a wide dashboard puts them two by two (the remote endpoint's panel across both columns
# at the top, the results table across both at the bottom)
PANEL_ORDER = (
    RemotePanel,
    PrefillDecodePanel,
    ThroughputPanel,
    StreamingPanel,
    KVPagesPanel,
    PageMapPanel,
    NumbersPanel,
    ResultsPanel,
)
TWO_COLUMNS_FROM_PX = 900


class DashboardWidget(QWidget):
    """The live dashboard. `source(since_step, since_token)` returns a MetricsSnapshot (MetricsRecorder.snapshot);
    it is called on the UI thread and must not block (the recorder only copies new records under a short lock)."""

    paused_changed = Signal(bool)
    panel_visibility_changed = Signal(str, bool)
    exported = Signal(str)

    def __init__(
        self,
        source: SnapshotSource | None = None,
        memory: MemoryInfo | None = None,
        parent: QWidget | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu_share: float = DEFAULT_SHARE,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("dashboard")
        self.history = MetricsHistory()
        self._source = source
        self._clock = clock
        self._paused_at: float | None = None
        self.budget = RedrawBudget(cpu_share)
        self._version = 0  # bumped whenever the records or the view settings change
        self._drawn: dict[str, tuple[int, float]] = {}  # panel -> (version it shows, when it was drawn)
        self.window_s = 30.0
        self.theme = theme_for(self.palette())

        self._build_toolbar()
        self.panels: dict[str, Panel] = {}
        self._grid_host = QWidget()
        self._grid_host.setObjectName("dashboard-panels")
        self._grid = QGridLayout(self._grid_host)
        self._grid.setContentsMargins(4, 4, 4, 4)
        self._grid.setSpacing(6)
        self._columns = 0
        for cls in PANEL_ORDER:
            panel = cls(self.theme)
            if cls is not RemotePanel:  # sizes itself: tall with charts, one line without
                panel.setMinimumHeight(230 if cls is not ResultsPanel else 120)
                panel.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
            self.panels[panel.key] = panel
        self._arrange(2)
        self.panels["results"].hide()  # until an experiment reports
        self.panels["remote"].hide()  # until the current chat runs on a remote endpoint
        self.remote.clock = self.now
        self.numbers.set_memory(memory or MemoryInfo())
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self._grid_host)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(self._toolbar)
        layout.addWidget(scroll, 1)
        self._sync_panel_menu()

        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.tick)
        self.timer.start()

    def _arrange(self, columns: int) -> None:
        """Panels in one column (a narrow dock) or two; the results table always spans the full width."""
        if columns == self._columns:
            return
        self._columns = columns
        for panel in self.panels.values():
            self._grid.removeWidget(panel)
        charts = [p for key, p in self.panels.items() if key not in ("results", "remote")]
        self._grid.addWidget(self.panels["remote"], 0, 0, 1, columns)
        for i, panel in enumerate(charts):
            self._grid.addWidget(panel, 1 + i // columns, i % columns)
        self._grid.addWidget(self.panels["results"], 1 + -(-len(charts) // columns), 0, 1, columns)
        for column in range(2):
            self._grid.setColumnStretch(column, 1 if column < columns else 0)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._rearrange(event.size().width())

    @contained
    def _rearrange(self, width: int) -> None:
        self._arrange(2 if width >= TWO_COLUMNS_FROM_PX else 1)

    def sizeHint(self) -> QSize:
        return QSize(1100, 900)

    # ---- toolbar -------------------------------------------------------------------------------
    def _build_toolbar(self) -> None:
        bar = self._toolbar = QHBoxLayout()
        bar.setContentsMargins(6, 4, 6, 0)
        self.window_box = QComboBox()
        self.window_box.addItems(list(WINDOWS))
        self.window_box.setToolTip("Time window of the charts and numbers")
        self.window_box.currentTextChanged.connect(lambda text: self.set_window(WINDOWS[text]))
        # tool buttons, not push buttons: their minimum is their text, so a narrow dock still has room for all
        self.pause_button = QToolButton()
        self.pause_button.setText("Pause")
        self.pause_button.setCheckable(True)
        self.pause_button.setToolTip("Freeze the charts to look closer; recording goes on underneath")
        self.pause_button.toggled.connect(self.set_paused)
        clear_button = QToolButton()
        clear_button.setText("Clear")
        clear_button.setToolTip("Forget everything recorded so far")
        clear_button.clicked.connect(self.clear)
        self.panel_menu = QMenu("Panels", self)
        panels_button = QToolButton()
        panels_button.setText("Panels")
        panels_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        panels_button.setMenu(self.panel_menu)
        export_menu = QMenu("Export", self)
        export_menu.addAction("Visible charts as PNG…", self._ask_export_png)
        export_menu.addAction("Recorded metrics as CSV…", self._ask_export_csv)
        export_menu.addAction("Recorded metrics as JSON…", self._ask_export_json)
        export_button = QToolButton()
        export_button.setText("Export")
        export_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        export_button.setMenu(export_menu)
        self.source_label = ElidedLabel()  # an experiment's long phase name must not widen the dock
        self.source_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.source_label.setObjectName("dashboard-source")
        for widget in (self.window_box, self.pause_button, clear_button, panels_button, export_button):
            bar.addWidget(widget)
        bar.addWidget(self.source_label, 1)

    def _sync_panel_menu(self) -> None:
        self.panel_menu.clear()
        for key, panel in self.panels.items():
            action = QAction(panel.title, self.panel_menu)
            action.setCheckable(True)
            action.setChecked(not panel.isHidden())
            action.toggled.connect(lambda on, key=key: self.set_panel_visible(key, on))
            self.panel_menu.addAction(action)

    # ---- public API ------------------------------------------------------------------------------
    @property
    def numbers(self) -> NumbersPanel:
        return self.panels["numbers"]  # type: ignore[return-value]

    @property
    def results(self) -> ResultsPanel:
        return self.panels["results"]  # type: ignore[return-value]

    @property
    def remote(self) -> RemotePanel:
        return self.panels["remote"]  # type: ignore[return-value]

    def set_remote(self, label: str | None) -> None:
        """The current chat runs on a remote endpoint named `label` (its panel shows), or on this computer (None)."""
        if label is not None and (label != self.remote.label or self.remote.isHidden()):
            self.remote.set_endpoint(label)
        self.set_panel_visible("remote", label is not None)

    def add_remote_metrics(self, snapshot: RemoteMetricsSnapshot | None) -> None:
        """A scrape of the remote endpoint's /metrics (the same snapshot again is ignored)."""
        if snapshot is not None and self.remote.add(snapshot):
            self._changed()

    @property
    def source(self) -> SnapshotSource | None:
        return self._source

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    def set_source(self, source: SnapshotSource | None, label: str = "") -> None:
        """Read from another recorder (an experiment's engine, a new model's engine); history continues."""
        if source != self._source:
            if self._source is not None:
                self.history.poll(self._source)  # the old source's last steps (a finished experiment's end)
            self.history.page_map = None  # pages belong to an engine: the new one publishes its own
            if source is not None and label:
                self.history.annotate(self._clock(), label)
        self._source = source
        self.source_label.setText(label)
        self._changed()
        self.tick()

    def set_memory(self, memory: MemoryInfo) -> None:
        self.numbers.set_memory(memory)
        self._changed()

    def set_window(self, seconds: float) -> None:
        self.window_s = seconds
        label = next((k for k, v in WINDOWS.items() if v == seconds), None)
        if label and self.window_box.currentText() != label:
            self.window_box.setCurrentText(label)
        self._changed()
        self.redraw()

    def set_paused(self, paused: bool) -> None:
        if paused == self.paused:
            return
        self._paused_at = self._clock() if paused else None
        self.pause_button.setChecked(paused)
        self.pause_button.setText("Resume" if paused else "Pause")
        self._changed()
        self.redraw()
        self.paused_changed.emit(paused)

    def clear(self) -> None:
        self.history.clear()
        self._changed()
        self.redraw()

    def set_panel_visible(self, key: str, visible: bool) -> None:
        panel = self.panels[key]
        if panel.isHidden() != visible:
            return
        panel.setVisible(visible)
        for action in self.panel_menu.actions():
            if action.text() == panel.title and action.isChecked() != visible:
                action.setChecked(visible)
        self._changed()
        self.redraw()
        self.panel_visibility_changed.emit(key, visible)

    def visible_panels(self) -> list[str]:
        return [key for key, panel in self.panels.items() if not panel.isHidden()]

    def show_experiment_result(self, title: str, columns, rows, notes=()) -> None:
        self.results.show_result(title, columns, rows, notes)
        self.set_panel_visible("results", True)

    # ---- the timer -------------------------------------------------------------------------------
    def _changed(self) -> None:
        self._version += 1

    @contained
    def tick(self) -> None:
        """Read what is new; redraw the panels that show something out of date, as the time budget allows."""
        self.budget.begin_tick()
        if self._source is not None and self.history.poll(self._source):
            self._changed()
        if self.isVisible() and not self.paused:
            now = self._clock()
            due = [key for key, panel in self.panels.items() if self._on_screen(panel) and self._stale(key, now)]
            if due:
                starved = [key for key in due if now - self._drawn.get(key, (0, 0.0))[1] >= STARVED_S]
                self._refresh(self.budget.pick(due, starved))
        else:
            self.budget.hold()
        self.budget.end_tick()

    def _on_screen(self, panel: Panel) -> bool:
        # hidden by the user, or scrolled out of the dashboard's view: nothing to draw
        return not panel.isHidden() and not panel.visibleRegion().isEmpty()

    def _stale(self, key: str, now: float) -> bool:
        version, when = self._drawn.get(key, (-1, 0.0))
        return version != self._version or now - when >= IDLE_REDRAW_S  # idle: the time axis still moves

    def now(self) -> float:
        return self._paused_at if self._paused_at is not None else self._clock()

    def redraw(self) -> None:
        """Redraw every shown panel at once (opening, setting changes, tests), whatever the budget."""
        self._refresh([key for key, panel in self.panels.items() if not panel.isHidden()], charge=False)
        self.budget.skip_gap()

    def _refresh(self, keys: list[str], charge: bool = True) -> None:
        view = self.history.window(self.window_s, self.now())
        drawn_at = self._clock()
        for key in keys:
            started = time.thread_time()
            contained(self.panels[key].refresh)(view)  # one broken panel must not stop the others
            if charge:
                self.budget.redrawn(key, time.thread_time() - started)
            self._drawn[key] = (self._version, drawn_at)

    # ---- showing, hiding, theme ------------------------------------------------------------------------
    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.timer.setInterval(POLL_MS)
        self._shown()

    @contained
    def _shown(self) -> None:
        # draw everything now, not in turns: whoever opened the dashboard wants to see it at once
        self._changed()
        if self._source is not None:
            self.history.poll(self._source)
        if not self.paused:
            self.redraw()

    def hideEvent(self, event) -> None:
        self.timer.setInterval(HIDDEN_POLL_MS)
        super().hideEvent(event)

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.FontChange):
            self.apply_theme()  # a new font size changes the room the axes need, too

    @contained
    def apply_theme(self) -> None:
        self.theme = theme_for(self.palette())
        for panel in self.panels.values():
            panel.apply_theme(self.theme)
        self._changed()
        if self.isVisible():
            self.redraw()  # legends and page colours are drawn from the theme: all of them, at once

    # ---- export ----------------------------------------------------------------------------------------
    def grab_panels(self) -> QPixmap:
        """The visible panels as one picture (hidden ones leave no gap: the grid closes up)."""
        return self._grid_host.grab()

    def export_png(self, path: str | Path) -> Path:
        path = Path(path)
        if not self.grab_panels().save(str(path), "PNG"):
            raise OSError(f"could not write {path}")
        self.exported.emit(str(path))
        return path

    def export_csv(self, path: str | Path) -> list[Path]:
        paths = export_csv(self.history, path)
        self.exported.emit(str(paths[0]))
        return paths

    def export_json(self, path: str | Path) -> Path:
        path = export_json(self.history, path)
        self.exported.emit(str(path))
        return path

    def _ask(self, caption: str, name: str, filter_: str) -> str:
        path, _ = QFileDialog.getSaveFileName(self, caption, name, filter_)
        return path

    def _ask_export_png(self) -> None:
        if path := self._ask("Export visible charts", "dashboard.png", "PNG images (*.png)"):
            self.export_png(path)

    def _ask_export_csv(self) -> None:
        if path := self._ask("Export metrics as CSV (steps, tokens, requests)", "metrics.csv", "CSV (*.csv)"):
            self.export_csv(path)

    def _ask_export_json(self) -> None:
        if path := self._ask("Export metrics as JSON", "metrics.json", "JSON (*.json)"):
            self.export_json(path)
