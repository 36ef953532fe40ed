"""Puts the live dashboard into the main window: its dock, a data source that follows the loaded model, the
Experiments menu, and the user's panel choices remembered across starts."""

from __future__ import annotations

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtWidgets import QMainWindow, QMenu

from app.chat.controller import Hold
from app.hosting.experiments_controller import ExperimentController, build_experiments_menu
from app.setting_values import number, read_setting
from widgets.chat.panel import CHAT_MIN_WIDTH
from widgets.dashboard.dashboard import WINDOWS, DashboardWidget
from widgets.dashboard.data.series import MemoryInfo

SETTINGS_GROUP = "dashboard"
# shown and hidden by what happens (an experiment reports, a chat runs on a remote), not remembered
AUTOMATIC_PANELS = {"results", "remote"}
REMOTE_POLL_MS = 1000  # the remote client scrapes /metrics once a second
DOCK_FRAME_PX = 16  # the dock's frame and the separator beside it


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
        engine = thread.engine
        dashboard.set_memory(
            MemoryInfo(getattr(info, "weight_bytes", 0), engine.cache.nbytes, name, kv_pages=engine.pool.num_pages)
        )

    remote = getattr(window, "remote", None)  # RemoteFeatures, where the window has remote endpoints

    def follow_model_unless_remote(info=None) -> None:
        if remote is None or remote.current_client() is None:
            follow_model(info)

    bridge.model_changed.connect(follow_model_unless_remote)
    follow_model()
    if remote is not None:
        _follow_remote_chats(dashboard, remote, follow_model)
    dock = window.install_dashboard(dashboard)
    _widen_when_first_shown(window, dock, dashboard)

    controller = ExperimentController(lambda: bridge.thread, dashboard, parent=window)
    controller.running_changed.connect(lambda running: running and window.dashboard_dock.show())
    controller.experiment_failed.connect(lambda message: _tell(window, message))
    menu = _experiments_menu(window)
    build_experiments_menu(menu, controller)
    controller.running_changed.connect(lambda running: _hold_chats(window, controller, running))
    window.experiments = controller
    return dashboard


def _hold_chats(window, controller: ExperimentController, running: bool) -> None:
    """An experiment runs in the engine thread, between steps: the chats on it wait, and say so, with a Stop."""
    tabs = getattr(window, "tabs", None)
    if tabs is None:
        return
    if running:
        tabs.hold("experiment", Hold(f"the {controller.title} experiment", "Stop the experiment", controller.cancel))
    else:
        tabs.release("experiment")


def _follow_remote_chats(dashboard: DashboardWidget, remote, follow_model) -> None:
    """When the current chat runs on a remote endpoint, the charts show the token timings measured here and the
    remote panel what the server reports of itself (or that it reports nothing); back on this computer's engine,
    the dashboard reads the engine again."""
    timer = QTimer(dashboard)
    timer.setInterval(REMOTE_POLL_MS)

    def read_scrape() -> None:
        client = remote.current_client()
        if client is not None:
            dashboard.add_remote_metrics(client.latest_metrics)

    def follow(client) -> None:
        if client is None:
            timer.stop()
            dashboard.set_remote(None)
            follow_model()
            return
        label = f"{client.model} @ {client.name}"
        dashboard.set_source(client.metrics.snapshot, f"{label} (timings measured here)")
        dashboard.set_memory(MemoryInfo(label=label))  # its memory is the server's: not known here
        dashboard.set_remote(label)
        read_scrape()
        timer.start()

    timer.timeout.connect(read_scrape)
    remote.remote_client_changed.connect(follow)
    if remote.current_client() is not None:
        follow(remote.current_client())


def dock_width_for(window_width: int, dashboard: DashboardWidget) -> int:
    """About half the window, never more than leaves the chat its readable width, never under the dashboard's own
    minimum (a window too narrow for both gets its minimum from Qt instead)."""
    room = window_width - CHAT_MIN_WIDTH - DOCK_FRAME_PX
    return max(dashboard.minimumSizeHint().width(), min(dashboard.sizeHint().width(), window_width // 2, room))


def _widen_when_first_shown(window: QMainWindow, dock, dashboard: DashboardWidget) -> None:
    """A dock opens at its widget's minimum width; the dashboard reads best about half the window wide."""
    done = False

    def widen(visible: bool) -> None:
        nonlocal done
        if visible and not done:
            done = True
            window.resizeDocks([dock], [dock_width_for(window.width(), dashboard)], Qt.Orientation.Horizontal)

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
        seconds = read_setting(settings, "window_s", 30.0, number(1, 86_400))
        hidden = settings.value("hidden_panels", [])
    finally:
        settings.endGroup()
    if seconds in WINDOWS.values():
        dashboard.set_window(seconds)
    for key in [hidden] if isinstance(hidden, str) else list(hidden or []):
        if key in dashboard.panels and key not in AUTOMATIC_PANELS:
            dashboard.set_panel_visible(key, False)

    def save(*_args) -> None:
        settings.beginGroup(SETTINGS_GROUP)
        settings.setValue("window_s", dashboard.window_s)
        hidden_now = [k for k, p in dashboard.panels.items() if p.isHidden() and k not in AUTOMATIC_PANELS]
        settings.setValue("hidden_panels", hidden_now)
        settings.endGroup()

    dashboard.panel_visibility_changed.connect(save)
    dashboard.window_box.currentTextChanged.connect(save)
