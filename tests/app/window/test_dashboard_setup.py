"""The dashboard in a main window: its source follows the loaded model, the Experiments menu, remembered panels."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QObject, QSettings, Signal
from PySide6.QtWidgets import QDockWidget, QMainWindow, QWidget

from app.window.dashboard_setup import DashboardHost, StudioDashboard, install_studio_dashboard
from app.window.menus import MenuId, Menus


class FakeBridge(QObject):
    """The part of the desktop's EngineBridge the dashboard uses."""

    model_changed = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.thread = None
        self.info = None


class FakeWindow(QMainWindow):
    def __init__(self) -> None:
        super().__init__()
        self.bridge = FakeBridge()
        self.dashboard: QWidget | None = None
        self.dashboard_dock = QDockWidget("Dashboard", self)
        self.menus = Menus(self.menuBar())
        self.menus.add(MenuId.VIEW, "&View")
        self.menus.add(MenuId.HELP, "&Help")
        self.experiments = None

    def install_dashboard(self, widget: QWidget, show: bool = False) -> QDockWidget:
        self.dashboard = widget
        self.dashboard_dock.setWidget(widget)
        return self.dashboard_dock

    def install_studio_dashboard(self, settings: QSettings) -> StudioDashboard:
        host = DashboardHost(self, self.bridge, self.dashboard_dock, self.install_dashboard, self.menus, settings)
        installed = install_studio_dashboard(host)
        self.experiments = installed.experiments
        return installed


@pytest.fixture
def settings(tmp_path) -> QSettings:
    return QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def worker(tiny_model_dir):
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine
    from engine.core.engine_thread import EngineThread
    from engine.load.loader import load_model

    engine = Engine(load_model(str(tiny_model_dir)), EngineConfig(kv_pages=32, page_size=4))
    thread = EngineThread(engine).start()
    yield thread
    thread.shutdown()


def test_the_source_follows_the_loaded_model_and_the_menu_is_there(qtbot, settings, worker) -> None:
    window = FakeWindow()
    qtbot.addWidget(window)
    dashboard = window.install_studio_dashboard(settings).dashboard
    assert window.dashboard is dashboard and dashboard.source is None
    assert dashboard.source_label.text() == "no model loaded"
    menus = [a.text() for a in window.menuBar().actions()]
    assert menus == ["&View", "E&xperiments", "&Help"]
    window.bridge.thread = worker
    window.bridge.info = worker.engine.loaded.info
    window.bridge.model_changed.emit(worker.engine.loaded.info)
    assert dashboard.source == worker.metrics.snapshot
    assert dashboard.numbers.memory.kv_pool_bytes == worker.engine.cache.nbytes
    assert dashboard.numbers.memory.weight_bytes == worker.engine.loaded.info.weight_bytes


def test_panel_choices_are_remembered(qtbot, settings) -> None:
    first = FakeWindow()
    qtbot.addWidget(first)
    dashboard = first.install_studio_dashboard(settings).dashboard
    dashboard.set_panel_visible("page_map", False)
    dashboard.window_box.setCurrentText("last 10 min")
    second = FakeWindow()
    qtbot.addWidget(second)
    again = second.install_studio_dashboard(settings).dashboard
    assert "page_map" not in again.visible_panels() and again.window_s == 600.0


def test_experiments_need_a_model(qtbot, settings) -> None:
    window = FakeWindow()
    qtbot.addWidget(window)
    window.install_studio_dashboard(settings)
    assert not window.experiments.run("batching")


def test_in_the_studio_window_a_chat_and_an_experiment_show_on_the_dashboard(qtbot, make_window) -> None:
    from engine.experiments.plumbing import ExperimentSizes

    window = make_window()
    dashboard = window.add_dashboard()
    assert dashboard.source == window.bridge.thread.metrics.snapshot  # the model loaded before the dashboard
    assert "E&xperiments" in [a.text() for a in window.menuBar().actions()]
    window.actions.dashboard.trigger()  # View > Dashboard
    assert dashboard.isVisible()
    chat = window.tabs.current or window.tabs.new_chat()
    assert chat.send("hello")
    qtbot.waitUntil(lambda: chat.title in dashboard.history.chats, timeout=30_000)  # its tokens are on the charts
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    window.experiments.sizes = ExperimentSizes.small()
    with qtbot.waitSignal(window.experiments.result_ready, timeout=60_000):
        assert window.experiments.run("memory_pressure")
    assert len(dashboard.results.cells()) == 2
    assert dashboard.source == window.bridge.thread.metrics.snapshot  # back on the chats' engine
