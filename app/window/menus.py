"""The window's menus by id: features add to a menu by its MenuId, never by its label (labels are for people)."""

from __future__ import annotations

from enum import StrEnum

from PySide6.QtWidgets import QMenu, QMenuBar


class MenuId(StrEnum):
    FILE = "file"
    CHAT = "chat"
    MODEL = "model"
    VIEW = "view"
    SERVER = "server"
    EXPERIMENTS = "experiments"
    HELP = "help"  # where a window has one, the menus added later go before it


class Menus:
    """The menus of one menu bar, registered by id in the order they appear."""

    def __init__(self, bar: QMenuBar) -> None:
        self.bar = bar
        self.by_id: dict[MenuId, QMenu] = {}

    def add(self, menu_id: MenuId, title: str) -> QMenu:
        """The menu of this id (made the first time, last in the bar, but before Help when there is one)."""
        if menu_id in self.by_id:
            return self.by_id[menu_id]
        menu = QMenu(title, self.bar)
        help_menu = self.by_id.get(MenuId.HELP)
        if help_menu is not None:
            self.bar.insertMenu(help_menu.menuAction(), menu)
        else:
            self.bar.addMenu(menu)
        self.by_id[menu_id] = menu
        return menu

    def __getitem__(self, menu_id: MenuId) -> QMenu:
        return self.by_id[menu_id]
