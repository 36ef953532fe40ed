"""Puts the live dashboard into the main window: its dock, a data source that follows the loaded model, the
Experiments menu, and the user's panel choices remembered across starts."""

from __future__ import annotations

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QMainWindow, QMenu

from app.experiments_controller import ExperimentController, build_experiments_menu
from widgets.dashboard.dashboard import WINDOWS, DashboardWidget
from widgets.dashboard.series import MemoryInfo

SETTINGS_GROUP = "dashboard"


def install_studio_dashboard(window: QMainWindow, settings: QSettings | None = None) -> DashboardWidget:
    """Create the dashboard for a main window that has `bridge` (EngineBridge), `install_dashboard(widget)` and
    `dashboard_dock`; returns it. The Experiments menu goes into the window's menu bar."""
    bridge = window.bridge
    # beside the studio's other settings (its INI file follows INFERENCE_STUDIO_HOME), else Qt's default place
    settings = settings or getattr(getattr(window, "settings", None), "qsettings", None) or QSettings()
    dashboard = DashboardWidget()
    _restore(dashboard, settings)

    def follow_model(info=None) -> None:
        thread = bridge.thread
        if thread is None:
            dashboard.set_source(None, "no model loaded")
            return
        info = info or bridge.info
        name = getattr(info, "name", "engine")
        dashboard.set_source(thread.metrics.snapshot, name)
        dashboard.set_memory(MemoryInfo(getattr(info, "weight_bytes", 0), thread.engine.cache.nbytes, name))

    bridge.model_changed.connect(follow_model)
    follow_model()
    dock = window.install_dashboard(dashboard)
    _widen_when_first_shown(window, dock, dashboard)

    controller = ExperimentController(lambda: bridge.thread, dashboard, parent=window)
    controller.running_changed.connect(lambda running: running and window.dashboard_dock.show())
    controller.experiment_failed.connect(lambda message: _tell(window, message))
    menu = _experiments_menu(window)
    build_experiments_menu(menu, controller)
    window.experiments = controller
    return dashboard


def _widen_when_first_shown(window: QMainWindow, dock, dashboard: DashboardWidget) -> None:
    """A dock opens at its widget's minimum width; the dashboard reads best about half the window wide."""
    done = False

    def widen(visible: bool) -> None:
        nonlocal done
        if visible and not done:
            done = True
            width = min(dashboard.sizeHint().width(), max(480, window.width() // 2))
            window.resizeDocks([dock], [width], Qt.Orientation.Horizontal)

    dock.visibilityChanged.connect(widen)


def _experiments_menu(window: QMainWindow) -> QMenu:
    bar = window.menuBar()
    menu = QMenu("E&xperiments", bar)
    menu.setToolTipsVisible(True)
    help_menu = next((a for a in bar.actions() if a.text().replace("&", "") == "Help"), None)
    if help_menu is not None:
        bar.insertMenu(help_menu, menu)
    else:
        bar.addMenu(menu)
    return menu


def _tell(window: QMainWindow, message: str) -> None:
    status = window.statusBar()
    if status is not None:
        status.showMessage(f"Experiment: {message}", 8000)


def _restore(dashboard: DashboardWidget, settings: QSettings) -> None:
    """Window and hidden panels as the user left them; saved again whenever they change."""
    settings.beginGroup(SETTINGS_GROUP)
    try:
        seconds = float(settings.value("window_s", 30.0))
        hidden = settings.value("hidden_panels", [])
    finally:
        settings.endGroup()
    if seconds in WINDOWS.values():
        dashboard.set_window(seconds)
    for key in [hidden] if isinstance(hidden, str) else list(hidden or []):
        if key in dashboard.panels and key != "results":
            dashboard.set_panel_visible(key, False)

    def save(*_args) -> None:
        settings.beginGroup(SETTINGS_GROUP)
        settings.setValue("window_s", dashboard.window_s)
        hidden_now = [k for k, p in dashboard.panels.items() if p.isHidden() and k != "results"]
        settings.setValue("hidden_panels", hidden_now)
        settings.endGroup()

    dashboard.panel_visibility_changed.connect(save)
    dashboard.window_box.currentTextChanged.connect(save)
