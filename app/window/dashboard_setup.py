"""Puts the live dashboard into the main window: its dock, a data source that follows the loaded model, the
Experiments menu, and the user's panel choices remembered across starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtWidgets import QDockWidget, QMainWindow, QWidget

from app.chat.controller import Hold
from app.hosting.experiments_controller import ExperimentController, build_experiments_menu
from app.setting_values import number, read_setting
from app.window.menus import MenuId, Menus
from widgets.chat.panel import CHAT_MIN_WIDTH
from widgets.dashboard.dashboard import WINDOWS, DashboardWidget
from widgets.dashboard.data.series import MemoryInfo

if TYPE_CHECKING:
    from app.chat.tabs import ChatTabs
    from app.hosting.engine_bridge import EngineBridge
    from app.remote.features import RemoteFeatures

SETTINGS_GROUP = "dashboard"
# shown and hidden by what happens (an experiment reports, a chat runs on a remote), not remembered
AUTOMATIC_PANELS = {"results", "remote"}
REMOTE_POLL_MS = 1000  # the remote client scrapes /metrics once a second
DOCK_FRAME_PX = 16  # the dock's frame and the separator beside it


@dataclass(frozen=True)
class DashboardHost:
    """What the dashboard uses of the window it goes into."""

    window: QMainWindow  # its dock is sized to the window, its notes go to the window's status bar
    bridge: EngineBridge  # the loaded model: `thread`, `info`, `model_changed`
    dock: QDockWidget
    install: Callable[[QWidget], QDockWidget]  # puts the dashboard into the dock
    menus: Menus  # the Experiments menu joins them
    settings: QSettings  # where the user's panel choices are kept
    tabs: ChatTabs | None = None  # the chats wait while an experiment runs
    remote: RemoteFeatures | None = None  # a chat on a remote endpoint: the dashboard shows its timings


@dataclass(frozen=True)
class StudioDashboard:
    dashboard: DashboardWidget
    experiments: ExperimentController


def install_studio_dashboard(host: DashboardHost) -> StudioDashboard:
    """Create the dashboard and its experiments; the Experiments menu goes into the host's menus."""
    bridge = host.bridge
    dashboard = DashboardWidget()
    _restore(dashboard, host.settings)

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

    remote = host.remote

    def follow_model_unless_remote(info=None) -> None:
        if remote is None or remote.current_client() is None:
            follow_model(info)

    bridge.model_changed.connect(follow_model_unless_remote)
    follow_model()
    if remote is not None:
        _follow_remote_chats(dashboard, remote, follow_model)
    dock = host.install(dashboard)
    _widen_when_first_shown(host.window, dock, dashboard)

    controller = ExperimentController(lambda: bridge.thread, dashboard, parent=host.window)
    controller.running_changed.connect(lambda running: running and host.dock.show())
    controller.experiment_failed.connect(lambda message: _tell(host.window, message))
    menu = host.menus.add(MenuId.EXPERIMENTS, "E&xperiments")
    menu.setToolTipsVisible(True)
    build_experiments_menu(menu, controller)
    if host.tabs is not None:
        tabs = host.tabs
        controller.running_changed.connect(lambda running: _hold_chats(tabs, controller, running))
    return StudioDashboard(dashboard, controller)


def _hold_chats(tabs: ChatTabs, controller: ExperimentController, running: bool) -> None:
    """An experiment runs in the engine thread, between steps: the chats on it wait, and say so, with a Stop."""
    if running:
        tabs.hold("experiment", Hold(f"the {controller.title} experiment", "Stop the experiment", controller.cancel))
    else:
        tabs.release("experiment")


def _follow_remote_chats(dashboard: DashboardWidget, remote: RemoteFeatures, follow_model: Callable[[], None]) -> None:
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


def _widen_when_first_shown(window: QMainWindow, dock: QDockWidget, dashboard: DashboardWidget) -> None:
    """A dock opens at its widget's minimum width; the dashboard reads best about half the window wide."""
    done = False

    def widen(visible: bool) -> None:
        nonlocal done
        if visible and not done:
            done = True
            window.resizeDocks([dock], [dock_width_for(window.width(), dashboard)], Qt.Orientation.Horizontal)

    dock.visibilityChanged.connect(widen)


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
