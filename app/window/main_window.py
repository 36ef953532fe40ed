"""MainWindow: chat tabs over one engine, notices, status bar, docks and dialogs; run_studio() starts it."""

from __future__ import annotations

import argparse
import gc
import logging
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QVBoxLayout,
    QWidget,
)

from app.chat.event_pump import EventPump
from app.chat.export import ChatDocument, ChatImportError, to_json, to_markdown
from app.chat.importer import ChatImporter
from app.chat.reply_router import ReplyRouter
from app.chat.store import ChatStore
from app.chat.store_recovery import OpenedStore, open_store
from app.chat.tabs import ChatTabs
from app.cli.options import load_options_from
from app.compare.controller import CompareController, CompareHost, install_compare
from app.hosting.backends import BackendRegistry
from app.hosting.engine_bridge import EngineBridge, Loader
from app.hosting.experiments_controller import ExperimentController
from app.hosting.hub_token import KeyringTokens
from app.hosting.model_switcher import FINISH, ModelSwitcher
from app.remote.features import RemoteFeatures, RemoteHost
from app.window.actions import build_actions, build_menus, build_toolbar, fit_toolbar
from app.window.dashboard_setup import DashboardHost, install_studio_dashboard
from app.window.engine_status import EngineStatus
from app.window.gui_collector import GuiCollector
from app.window.interrupts import close_on_interrupt
from app.window.qt_messages import route_qt_messages
from app.window.self_test import SelfTest, isolate_user_data
from app.window.settings import StudioSettings
from app.window.theme import ThemeManager
from engine.domain.model_choice import ModelChoice
from engine.load.loader import load_model
from widgets.dialogs.history import HistoryDialog
from widgets.dialogs.settings import SettingsDialog, SettingsValues
from widgets.notice_bar import ERROR, INFO, NoticeBar
from widgets.status_bar import StudioStatusBar

log = logging.getLogger(__name__)


class MainWindow(QMainWindow):
    chat_imported = Signal(bool)  # an import ended: a chat was opened (True) or the notice bar says why not

    def __init__(
        self,
        settings: StudioSettings,
        store: ChatStore | None = None,
        loader: Loader = load_model,
        theme: ThemeManager | None = None,
    ) -> None:
        super().__init__()
        self.setWindowTitle("Inference Studio")
        self.setObjectName("mainWindow")
        self.settings = settings
        # a damaged store is moved aside and salvaged, a read-only folder runs with history off: said below
        opened = OpenedStore(store) if store is not None else open_store()
        self.store = opened.store
        self.theme = theme
        self.registry = BackendRegistry(self)
        self.pump = EventPump(self)
        self.router = ReplyRouter(self.pump.sink)
        self.pump.events_arrived.connect(self.router.dispatch)
        self.bridge = EngineBridge(self.registry, self.pump, loader, engine_config=lambda: settings.engine_config)
        # through a lambda: the question is asked by whatever `confirm` is at the time (tests replace it)
        self.tabs = ChatTabs(self.store, self.registry, self.router, lambda t, q: self.confirm(t, q), self)
        self.tabs.set_send_key(settings.send_key)
        self.tabs.set_settings_visible(settings.settings_panel_visible)
        self.tabs.set_sidebar_width(settings.sidebar_width)
        self.notice = self._build_central(opened)
        self.status = StudioStatusBar()
        self.setStatusBar(self.status)
        self.dashboard: QWidget | None = None
        self.experiments: ExperimentController | None = None  # with the studio's dashboard (add_dashboard)
        self.dashboard_dock = self._build_dashboard_dock()
        self.actions = build_actions(self, self, self.dashboard_dock, settings.settings_panel_visible)
        self.menus = build_menus(self, self.actions)
        self.toolbar = build_toolbar(self, self.actions)
        self.tabs.widget.tabBarDoubleClicked.connect(self._rename_tab_at)
        self.tabs.sidebar_toggled.connect(self._set_settings_panel)
        self.tabs.sidebar_width_changed.connect(lambda width: setattr(self.settings, "sidebar_width", width))
        self.tabs.open_chats_changed.connect(self._refresh_history)
        self.history_dialog: HistoryDialog | None = None
        self.importer = ChatImporter(self)
        self.importer.read.connect(self._import_read)
        self.switcher = ModelSwitcher(self, self.bridge, self.tabs, self.notice, self.status, settings)
        self.engine_status = EngineStatus(self.status, self.bridge, self.tabs, self)
        self.bridge.engine_failed.connect(lambda text: self.notice.show_message(text, ERROR))
        self.tabs.restore(settings.current_chat)
        self.remote = RemoteFeatures(self._remote_host())  # remote endpoints per chat, the API server toggle
        self.compare: CompareController = install_compare(
            CompareHost(self, self.bridge, self.tabs, settings, self.remote.backends, self.menus)
        )
        self.toolbar_fit = fit_toolbar(self.toolbar, self.actions, self.remote.picker)
        self._restore_geometry()

    def _build_central(self, opened: OpenedStore) -> NoticeBar:
        """The notice bar over the chat tabs; it says what happened to a damaged or read-only store."""
        notice = NoticeBar()
        self.store.on_write_failed = lambda text: notice.show_message(text, ERROR)
        if opened.notice:
            notice.show_message(opened.notice, ERROR if opened.warning else INFO)
        central = QWidget()
        column = QVBoxLayout(central)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(notice)
        column.addWidget(self.tabs.widget, 1)
        self.setCentralWidget(central)
        return notice

    def _remote_host(self) -> RemoteHost:
        def confirm(title: str, question: str) -> bool:  # whatever `self.confirm` is when asked (tests replace it)
            return self.confirm(title, question)

        return RemoteHost(self, self.settings, self.registry, self.pump, self.bridge, self.tabs, self.notice,
                          self.status, self.toolbar, self.actions.choose_model, self.menus, confirm)  # fmt: skip

    # ---- the dashboard dock -------------------------------------------------------------------
    def _build_dashboard_dock(self) -> QDockWidget:
        dock = QDockWidget("Dashboard", self)
        dock.setObjectName("dashboardDock")
        placeholder = QLabel("The live engine dashboard appears here once it is installed.")
        placeholder.setObjectName("placeholder")
        placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        dock.setWidget(placeholder)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, dock)
        dock.hide()
        return dock

    def install_dashboard(self, widget: QWidget, show: bool = False) -> QDockWidget:
        """Put a dashboard widget into the View > Dashboard dock. The widget pulls its data itself, on its own
        timer, from `self.bridge.metrics()` (the live engine's MetricsRecorder, or None while none is loaded;
        it changes when a model is swapped: `self.bridge.model_changed`). The self-test grabs it while chats
        stream and saves it as dashboard-streaming.png."""
        self.dashboard = widget
        self.dashboard_dock.setWidget(widget)
        if show:
            self.dashboard_dock.show()
        return self.dashboard_dock

    def add_dashboard(self) -> QWidget:
        """The studio's live dashboard in the dock, its experiments in the Experiments menu."""
        host = DashboardHost(self, self.bridge, self.dashboard_dock, self.install_dashboard, self.menus,
                             self.settings.qsettings, self.tabs, self.remote)  # fmt: skip
        installed = install_studio_dashboard(host)
        self.experiments = installed.experiments
        return installed.dashboard

    # ---- models and status ----------------------------------------------------------------
    def load_model(self, choice: ModelChoice, policy: str = FINISH) -> bool:
        return self.switcher.load(choice, policy)

    def open_model_picker(self) -> None:
        self.switcher.open_picker()

    def refresh_status(self) -> None:
        self.engine_status.refresh()

    # ---- chat actions -----------------------------------------------------------------------
    def new_chat(self) -> None:
        self.tabs.new_chat()

    def step_chat(self, step: int) -> None:
        self.tabs.step(step)

    def confirm(self, title: str, question: str) -> bool:
        answer = QMessageBox.question(self, title, question)
        return answer == QMessageBox.StandardButton.Yes

    def stop_current(self) -> None:
        controller = self.tabs.current
        if controller is None:
            return
        if controller.busy:
            controller.stop()
        elif controller.panel.editing_index is not None:
            controller.panel.edit_notice.dismiss()

    def regenerate_current(self) -> None:
        if self.tabs.current is not None:
            self.tabs.current.regenerate()

    def close_current_tab(self) -> None:
        self.tabs.close_tab(self.tabs.widget.currentIndex())

    def _rename_tab_at(self, index: int) -> None:
        if index >= 0:
            self.tabs.widget.setCurrentIndex(index)
            self.rename_current_dialog()

    def rename_current_dialog(self) -> None:
        controller = self.tabs.current
        if controller is None:
            return
        title, ok = QInputDialog.getText(self, "Rename chat", "Name", text=controller.title)
        if ok:
            controller.rename(title)

    def toggle_settings_panel(self) -> None:
        visible = self.actions.settings_panel.isChecked()
        self.settings.settings_panel_visible = visible
        self.tabs.set_settings_visible(visible)

    def _set_settings_panel(self, visible: bool) -> None:
        """A chat's own toggle: the same as View > Chat settings panel."""
        self.actions.settings_panel.setChecked(visible)
        self.toggle_settings_panel()

    # ---- export, import, history ------------------------------------------------------------
    def export_chat(self, path: Path, fmt: str) -> None:
        controller = self.tabs.current
        if controller is None:
            return
        document = ChatDocument(controller.title, controller.settings, controller.messages)
        text = to_markdown(document) if fmt == "md" else to_json(document)
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as exc:
            self.notice.show_message(f"Could not write {path}: {exc.strerror or exc}", ERROR)
            return
        self.notice.show_message(f"Exported “{controller.title}” to {path}.", INFO)

    def export_chat_dialog(self, fmt: str) -> None:
        controller = self.tabs.current
        if controller is None:
            return
        name = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in controller.title).strip() or "chat"
        filters = "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", f"{name}.{fmt}", filters)
        if path:
            self.export_chat(Path(path), fmt)

    def import_chat(self, path: Path) -> None:
        """Read and check the file in a worker thread (a big or hostile file never blocks the window); the chat opens,
        or the notice bar says why not, when it is done (chat_imported tells whether it was)."""
        self.importer.start(Path(path))

    def _import_read(self, path: Path, result: ChatDocument | ChatImportError) -> None:
        if isinstance(result, ChatImportError):
            self.notice.show_message(f"Could not import: {result}", ERROR)
            self.chat_imported.emit(False)
            return
        # two tabs of one name would be told apart by nothing (the dashboard's colours go by it, too)
        controller = self.tabs.new_chat(result.settings, self.tabs.unique_title(result.title), result.messages)
        if controller.chat_id >= 0:  # else the store said why (a full disk) and the chat is open unsaved
            self.notice.show_message(f"Imported “{controller.title}” from {path}.", INFO)
        self.chat_imported.emit(True)

    def import_chat_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import chat", "", "Chats exported as JSON (*.json)")
        if path:
            self.import_chat(Path(path))

    def open_history(self) -> None:
        if self.history_dialog is None:
            self.history_dialog = HistoryDialog(self.store.list_chats, self)
            self.history_dialog.open_requested.connect(self.tabs.open_chat)
            self.history_dialog.delete_requested.connect(self.delete_chat)
        self.history_dialog.refresh()
        self.history_dialog.show()
        self.history_dialog.raise_()

    def _refresh_history(self) -> None:
        # the dialog stays open beside the chats: its "open" tags follow the tabs
        if self.history_dialog is not None and self.history_dialog.isVisible():
            self.history_dialog.refresh()

    def delete_chat(self, chat_id: int) -> None:
        if not self.confirm("Delete chat", "Delete this chat and all its messages? This cannot be undone."):
            return
        self.tabs.close_chat_id(chat_id)
        self.store.delete_chat(chat_id)

    # ---- settings ---------------------------------------------------------------------------
    def open_settings(self) -> None:
        s = self.settings
        values = SettingsValues(
            s.theme, s.font_size, s.send_key, s.default_model.kv_memory_mib, s.default_model, s.engine_config
        )
        dialog = SettingsDialog(values, KeyringTokens(), self.bridge.choice, self)
        if dialog.exec() == SettingsDialog.DialogCode.Accepted:
            self.apply_settings(dialog.values())

    def apply_settings(self, values: SettingsValues) -> None:
        s = self.settings
        s.theme, s.font_size, s.send_key = values.theme, values.font_size, values.send_key
        s.kv_memory_mib = values.kv_memory_mib
        s.engine_config = values.engine
        # the KV budget belongs to the model loaded at start (the picker starts from the current model's own)
        s.default_model = replace(values.default_model, kv_memory_mib=values.kv_memory_mib)
        s.sync()
        if self.theme is not None:
            self.theme.set(values.theme, values.font_size)
        self.tabs.set_send_key(values.send_key)

    # ---- lifetime ---------------------------------------------------------------------------
    def _restore_geometry(self) -> None:
        geometry, state = self.settings.window_state()
        if geometry is not None:
            self.restoreGeometry(geometry)
        else:
            self.resize(1200, 780)
        if state is not None:
            self.restoreState(state)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Stop every reply (keeping its text), stop the engine, remember the window."""
        self.engine_status.stop()
        self.settings.save_window_state(self.saveGeometry(), self.saveState())
        self.settings.current_chat = self.tabs.current.chat_id if self.tabs.current else None
        self.settings.sync()
        # Stop the replies as Esc does: the engine's final events carry their statistics, and stopping the engine
        # delivers them (bridge.shutdown flushes the event pump); whatever is still open after that ends here.
        self.tabs.stop_all(backend_id=None)
        self.remote.shutdown()
        self.bridge.shutdown()
        self.tabs.shutdown()
        if self.history_dialog is not None:
            self.history_dialog.close()
        self.importer.shutdown()
        event.accept()


def initial_choice(args: argparse.Namespace, settings: StudioSettings) -> ModelChoice:
    """--model and its options when given, else the default model from the settings."""
    if getattr(args, "model", None):
        return ModelChoice.of(args.model, load_options_from(args), settings.kv_memory_mib)
    return settings.default_model


def run_studio(args: argparse.Namespace) -> int:
    """Open the window with the model loading in the background; with --self-test, check it and exit."""
    if getattr(args, "self_test", False):
        isolate_user_data()
    route_qt_messages()
    app = QApplication.instance() or QApplication(["inference-studio"])
    app.setApplicationName("Inference Studio")
    app.setDesktopFileName("inference-studio")
    # Python's cycle collector runs in whichever thread allocates; collecting a Qt object in the engine or
    # HTTP thread destroys it there, which Qt answers with warnings or a crash. Collect in the GUI thread only.
    collector = GuiCollector(interval=0.5)
    try:
        settings = StudioSettings()
        theme = ThemeManager(app)
        theme.set(settings.theme, settings.font_size)
        window = MainWindow(settings, theme=theme)
        window.add_dashboard()
        window.show()
        # the self-test listens before the load starts: a load that fails at once (a missing file) is not missed
        self_test = SelfTest(window, getattr(args, "screenshot", None)) if getattr(args, "self_test", False) else None
        window.load_model(initial_choice(args, settings))
        if self_test is not None:
            return self_test.run()
        restore_interrupts = close_on_interrupt(window)
        log.info("the window is open (Ctrl+C here closes it)")
        try:
            return app.exec()
        finally:
            restore_interrupts()
    finally:
        collector.timer.stop()
        gc.enable()  # the caller (a test, bench-ui) goes on with Python's own collector
