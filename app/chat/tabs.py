"""ChatTabs: the open chats as tabs: new, open, close (asking if a reply streams), rename, reorder, restore."""

from __future__ import annotations

import re
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QToolButton

from app.chat.controller import ChatController, Hold
from app.chat.reply_router import ReplyRouter
from app.chat.store import ChatStore, StoredChat
from app.hosting.backends import LOCAL, BackendRegistry
from engine.domain.chat import ChatMessage, ChatSettings
from widgets.steady_tabs import SteadyTabWidget

Confirm = Callable[[str, str], bool]
_NUMBERED = re.compile(r"^Chat (\d+)$")
_BUSY_MARK = " ●"


class ChatTabs(QObject):
    current_changed = Signal(object)  # the ChatController shown, or None
    busy_changed = Signal()  # some tab started or finished a reply
    open_chats_changed = Signal()  # a chat was opened or closed (the history marks open ones)
    sidebar_toggled = Signal(bool)  # the user showed or hid a chat's settings sidebar (all tabs follow)
    sidebar_width_changed = Signal(int)  # the user dragged a chat's splitter (all tabs follow)

    def __init__(
        self,
        store: ChatStore,
        registry: BackendRegistry,
        router: ReplyRouter,
        confirm: Confirm,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._store = store
        self._registry = registry
        self._router = router
        self._confirm = confirm
        self._send_key = "enter"
        self._settings_visible = True
        self._sidebar_width = 0  # 0: the panel's default
        self._holds: dict[str, Hold] = {}  # what has the local engine to itself now (an experiment, a comparison)
        # tab titles whose busy mark changed, set once the sends or ends of this pass are done: each setTabText lays
        # the tab bar out again (0.4 ms with 16 tabs), and a compare or a burst of sends would make the last request
        # wait for every earlier tab's title before it reaches the engine
        self._stale_titles: set[ChatController] = set()
        self._title_refresh = QTimer(self)
        self._title_refresh.setSingleShot(True)
        self._title_refresh.setInterval(0)
        self._title_refresh.timeout.connect(self._refresh_stale_titles)
        self.widget = SteadyTabWidget()
        self.widget.setObjectName("chatTabs")
        self.widget.setTabsClosable(True)
        self.widget.setMovable(True)
        self.widget.setDocumentMode(True)
        self.widget.tabCloseRequested.connect(lambda index: self.close_tab(index))
        self.widget.currentChanged.connect(lambda _index: self.current_changed.emit(self.current))
        self.widget.tabBar().tabMoved.connect(lambda _a, _b: self._save_open_tabs())
        self.new_tab_button = QToolButton()
        self.new_tab_button.setText("+")
        self.new_tab_button.setToolTip("New chat (Ctrl+T)")
        self.new_tab_button.setAutoRaise(True)
        self.new_tab_button.clicked.connect(lambda: self.new_chat())
        self.widget.setCornerWidget(self.new_tab_button)
        registry.backend_changed.connect(self._on_backend_changed)

    # ---- lookup -----------------------------------------------------------------------------
    @property
    def controllers(self) -> list[ChatController]:
        """In tab order."""
        return [self.widget.widget(i).property("controller") for i in range(self.widget.count())]

    @property
    def current(self) -> ChatController | None:
        panel = self.widget.currentWidget()
        return panel.property("controller") if panel is not None else None

    def index_of(self, controller: ChatController) -> int:
        return self.widget.indexOf(controller.panel)

    def busy_count(self, backend_id: str | None = LOCAL) -> int:
        return sum(1 for c in self.controllers if c.busy and (backend_id is None or c.backend_id == backend_id))

    def streaming_count(self, backend_id: str | None = LOCAL) -> int:
        return sum(1 for c in self.controllers if c.streaming and (backend_id is None or c.backend_id == backend_id))

    # ---- opening ----------------------------------------------------------------------------
    def next_title(self) -> str:
        used = {int(m.group(1)) for c in self.controllers if (m := _NUMBERED.match(c.title))}
        number = 1
        while number in used:
            number += 1
        return f"Chat {number}"

    def unique_title(self, title: str) -> str:
        """`title`, or "title (imported)" where a tab has it: an imported chat keeps its name (a "Chat 3" that
        became "Chat 7" could not be found again)."""
        taken = {c.title for c in self.controllers}
        if title not in taken:
            return title
        candidate, number = f"{title} (imported)", 2
        while candidate in taken:
            candidate, number = f"{title} (imported {number})", number + 1
        return candidate

    def new_chat(
        self,
        settings: ChatSettings | None = None,
        title: str | None = None,
        messages: list[ChatMessage] | None = None,
    ) -> ChatController:
        settings = settings or ChatSettings()
        title = title or self.next_title()
        chat_id = self._store.create_chat(title, settings, messages=messages or ())  # one transaction
        return self._add(StoredChat(chat_id, title, settings, LOCAL, list(messages or [])))

    def open_chat(self, chat_id: int) -> ChatController | None:
        for controller in self.controllers:
            if controller.chat_id == chat_id:
                self.widget.setCurrentWidget(controller.panel)
                return controller
        chat = self._store.load_chat(chat_id)
        return self._add(chat) if chat is not None else None

    def restore(self, current_chat: int | None = None) -> None:
        """Reopen the tabs that were open last time, in their order and with the same one in front,
        or start with one empty chat."""
        for chat_id in self._store.open_tabs():
            chat = self._store.load_chat(chat_id)
            if chat is not None:
                self._add(chat, select=False)
        if not self.controllers:
            self.new_chat()
        front = [c for c in self.controllers if c.chat_id == current_chat]
        self.widget.setCurrentWidget(front[0].panel if front else self.controllers[0].panel)

    def _add(self, chat: StoredChat, select: bool = True) -> ChatController:
        controller = ChatController(chat, self._store, self._registry, self._router)
        controller.setParent(self)
        controller.panel.setProperty("controller", controller)
        controller.panel.input.set_send_key(self._send_key)
        controller.panel.set_settings_visible(self._settings_visible)
        if self._sidebar_width:
            controller.panel.set_sidebar_width(self._sidebar_width)
        controller.panel.sidebar_toggled.connect(self.sidebar_toggled)
        controller.panel.sidebar_width_changed.connect(self._on_sidebar_width)
        controller.title_changed.connect(lambda _title, c=controller: self._refresh_tab(c))
        controller.busy_changed.connect(lambda _busy, c=controller: self._on_busy(c))
        if self._holds:
            controller.hold(next(iter(self._holds.values())))
        index = self.widget.addTab(controller.panel, chat.title)
        controller.refresh_context()
        if select:
            self.widget.setCurrentIndex(index)
            controller.panel.input.setFocus()
        self._save_open_tabs()
        self.open_chats_changed.emit()
        return controller

    # ---- closing, renaming, moving ----------------------------------------------------------
    def close_tab(self, index: int, ask: bool = True) -> bool:
        panel = self.widget.widget(index)
        if panel is None:
            return False
        controller: ChatController = panel.property("controller")
        if controller.busy and ask:
            question = f"“{controller.title}” is still writing a reply. Stop it and close the chat?"
            if not self._confirm("Close chat", question):
                return False
        controller.shutdown()
        self._stale_titles.discard(controller)  # deleted below: its title has no tab to go to
        self.widget.removeTab(index)
        panel.deleteLater()
        controller.deleteLater()
        if not self.controllers:
            self.new_chat()
        self._save_open_tabs()
        self.busy_changed.emit()
        self.open_chats_changed.emit()
        return True

    def close_chat_id(self, chat_id: int) -> None:
        for controller in self.controllers:
            if controller.chat_id == chat_id:
                self.close_tab(self.index_of(controller), ask=False)

    def rename(self, index: int, title: str) -> None:
        panel = self.widget.widget(index)
        if panel is not None:
            panel.property("controller").rename(title)

    def step(self, delta: int) -> None:
        """Next (+1) or previous (-1) tab, wrapping around."""
        count = self.widget.count()
        if count:
            self.widget.setCurrentIndex((self.widget.currentIndex() + delta) % count)

    def _refresh_tab(self, controller: ChatController) -> None:
        index = self.index_of(controller)
        if index >= 0:
            self.widget.setTabText(index, controller.title + (_BUSY_MARK if controller.busy else ""))
            self.widget.setTabToolTip(index, "writing a reply…" if controller.busy else "")

    def _on_busy(self, controller: ChatController) -> None:
        self._stale_titles.add(controller)
        self._title_refresh.start()
        self.busy_changed.emit()

    def _refresh_stale_titles(self) -> None:
        stale, self._stale_titles = self._stale_titles, set()
        for controller in stale:
            self._refresh_tab(controller)

    def _save_open_tabs(self) -> None:
        self._store.set_open_tabs([c.chat_id for c in self.controllers])

    # ---- all tabs ---------------------------------------------------------------------------
    def _on_backend_changed(self, backend_id: str) -> None:
        for controller in self.controllers:
            if controller.backend_id == backend_id:
                controller.backend_available()
                controller.context.forget_pages()  # a new engine (or none): the old pool's pages are gone
                controller.refresh_context()

    def hold(self, key: str, hold: Hold) -> None:
        """Something has the local engine to itself until release(key): chats on it say so, and wait for it."""
        self._holds[key] = hold
        for controller in self.controllers:
            if controller.backend_id == LOCAL:
                controller.hold(hold)
        self.busy_changed.emit()

    def release(self, key: str) -> None:
        if self._holds.pop(key, None) is None:
            return
        rest = next(iter(self._holds.values()), None)
        for controller in self.controllers:
            if rest is not None and controller.backend_id == LOCAL:
                controller.hold(rest)
            else:
                controller.release()
        self.busy_changed.emit()

    @property
    def held_by(self) -> str | None:
        """What has the local engine to itself now, in words, or None."""
        return next(iter(self._holds.values())).what if self._holds else None

    def update_kv_pages(self, page_map) -> None:
        """The local engine's newest page map: each chat on it counts the pages it holds or left cached."""
        for controller in self.controllers:
            if controller.backend_id == LOCAL:
                controller.update_kv_pages(page_map)

    def stop_all(self, backend_id: str | None = LOCAL) -> None:
        for controller in self.controllers:
            if controller.streaming and (backend_id is None or controller.backend_id == backend_id):
                controller.stop()

    def set_send_key(self, send_key: str) -> None:
        self._send_key = send_key
        for controller in self.controllers:
            controller.panel.input.set_send_key(send_key)

    def set_settings_visible(self, visible: bool) -> None:
        self._settings_visible = visible
        for controller in self.controllers:
            controller.panel.set_settings_visible(visible)

    def set_sidebar_width(self, width: int) -> None:
        self._sidebar_width = width
        for controller in self.controllers:
            controller.panel.set_sidebar_width(width)

    def _on_sidebar_width(self, width: int) -> None:
        self.set_sidebar_width(width)
        self.sidebar_width_changed.emit(width)

    def shutdown(self) -> None:
        """The window closes: stop every reply, keeping what was generated; remember the open tabs."""
        self._save_open_tabs()
        for controller in self.controllers:
            controller.shutdown()
        self._title_refresh.stop()  # the window goes: no title to set, and the tabs' widgets may be gone first
        self._stale_titles.clear()
