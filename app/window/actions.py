"""The main window's actions, menus and toolbar, with their shortcuts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMainWindow, QToolBar, QWidget

from app.window.menus import MenuId, Menus
from app.window.toolbar_fit import ToolbarFit


class WindowCommands(Protocol):
    """What the actions run: the main window's commands (the window itself provides them)."""

    def new_chat(self) -> object: ...
    def close_current_tab(self) -> None: ...
    def open_history(self) -> None: ...
    def import_chat_dialog(self) -> None: ...
    def export_chat_dialog(self, fmt: str) -> None: ...
    def open_settings(self) -> None: ...
    def stop_current(self) -> None: ...
    def regenerate_current(self) -> None: ...
    def rename_current_dialog(self) -> None: ...
    def step_chat(self, step: int) -> None: ...
    def open_model_picker(self) -> None: ...
    def toggle_settings_panel(self) -> None: ...


@dataclass
class WindowActions:
    new_chat: QAction
    close_chat: QAction
    history: QAction
    import_chat: QAction
    export_markdown: QAction
    export_json: QAction
    settings: QAction
    quit: QAction
    stop: QAction
    regenerate: QAction
    rename: QAction
    next_chat: QAction
    previous_chat: QAction
    choose_model: QAction
    settings_panel: QAction
    dashboard: QAction


def _action(window: QWidget, text: str, slot: Callable[[], object], shortcut=None, tip: str = "") -> QAction:
    action = QAction(text, window)
    if shortcut is not None:
        action.setShortcut(QKeySequence(shortcut))
        # window-wide: the shortcut works wherever the focus is (the message box, the transcript, a tab)
        action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    if tip:
        action.setToolTip(tip)
        action.setStatusTip(tip)
    action.triggered.connect(lambda _checked=False: slot())
    window.addAction(action)
    return action


def build_actions(
    window: QMainWindow, commands: WindowCommands, dashboard_dock: QDockWidget, settings_panel_visible: bool
) -> WindowActions:
    """The window's actions, each added to the window (its shortcut works wherever the focus is)."""
    c = commands
    actions = WindowActions(
        new_chat=_action(window, "&New chat", c.new_chat, "Ctrl+T", "Open a new chat tab"),
        close_chat=_action(window, "&Close chat", c.close_current_tab, "Ctrl+W", "Close this chat tab"),
        history=_action(window, "Chat &history…", c.open_history, "Ctrl+H", "Reopen, search or delete chats"),
        import_chat=_action(window, "&Import chat…", c.import_chat_dialog, "Ctrl+I", "Open a chat exported as JSON"),
        export_markdown=_action(window, "Export as &Markdown…", lambda: c.export_chat_dialog("md"), "Ctrl+E"),
        export_json=_action(window, "Export as &JSON…", lambda: c.export_chat_dialog("json"), "Ctrl+Shift+E"),
        settings=_action(window, "&Settings…", c.open_settings, "Ctrl+,", "Theme, fonts, default model, hub token"),
        quit=_action(window, "&Quit", window.close, "Ctrl+Q"),
        stop=_action(window, "&Stop reply", c.stop_current, "Esc", "Stop the reply, keeping what was written"),
        regenerate=_action(window, "&Regenerate reply", c.regenerate_current, "Ctrl+R", "Write the last reply again"),
        rename=_action(window, "Re&name chat…", c.rename_current_dialog, "F2"),
        next_chat=_action(window, "Ne&xt chat", lambda: c.step_chat(1), "Ctrl+Tab"),
        previous_chat=_action(window, "&Previous chat", lambda: c.step_chat(-1), "Ctrl+Shift+Tab"),
        choose_model=_action(
            window, "&Choose model…", c.open_model_picker, "Ctrl+Shift+M", "Load another model or quantization"
        ),
        settings_panel=_action(window, "Chat settings &panel", c.toggle_settings_panel, "Ctrl+Shift+P"),
        dashboard=dashboard_dock.toggleViewAction(),
    )
    actions.settings_panel.setCheckable(True)
    actions.settings_panel.setChecked(settings_panel_visible)
    actions.dashboard.setText("&Dashboard")
    actions.dashboard.setShortcut(QKeySequence("Ctrl+Shift+D"))
    return actions


def build_menus(window: QMainWindow, actions: WindowActions) -> Menus:
    """File, Chat, Model and View; features add theirs (and to these) by MenuId."""
    menus = Menus(window.menuBar())
    file_menu = menus.add(MenuId.FILE, "&File")
    for action in (actions.new_chat, actions.history, None, actions.import_chat, actions.export_markdown,
                   actions.export_json, None, actions.settings, None, actions.close_chat, actions.quit):  # fmt: skip
        file_menu.addSeparator() if action is None else file_menu.addAction(action)
    chat_menu = menus.add(MenuId.CHAT, "&Chat")
    for action in (actions.stop, actions.regenerate, actions.rename, None, actions.next_chat, actions.previous_chat):
        chat_menu.addSeparator() if action is None else chat_menu.addAction(action)
    menus.add(MenuId.MODEL, "&Model").addAction(actions.choose_model)
    view_menu = menus.add(MenuId.VIEW, "&View")
    view_menu.addAction(actions.settings_panel)
    view_menu.addAction(actions.dashboard)
    return menus


def build_toolbar(window: QMainWindow, actions: WindowActions) -> QToolBar:
    toolbar = QToolBar("Main")
    toolbar.setObjectName("mainToolbar")
    toolbar.setMovable(False)
    toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
    for action in (actions.new_chat, actions.choose_model, None, actions.stop, actions.regenerate, None,
                   actions.history, actions.settings):  # fmt: skip
        toolbar.addSeparator() if action is None else toolbar.addAction(action)
    window.addToolBar(toolbar)
    return toolbar


def fit_toolbar(toolbar: QToolBar, actions: WindowActions, picker: QWidget) -> ToolbarFit:
    """Short labels for when the full ones do not fit (a large font, a narrow window); menus keep the full ones."""
    short = [(actions.new_chat, "New"), (actions.choose_model, "Model"), (actions.stop, "Stop"),
             (actions.regenerate, "Regenerate"), (actions.history, "History"),
             (actions.settings, "Settings")]  # fmt: skip
    return ToolbarFit(toolbar, short, slim=[picker])
