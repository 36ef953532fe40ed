"""RemoteFeatures: the window's remote side: per-chat choice of a remote endpoint's model, adding and
removing endpoints, the API server toggle, and the remote's own metrics in the status bar."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QLabel, QMenu, QStatusBar, QToolBar, QWidget

from app.hosting.api_server_control import ApiServerControl
from app.hosting.backends import LOCAL
from app.hosting.server_settings import ServerKeys, ServerSettings
from app.remote.backends import RemoteBackends, parse_backend_id, remote_backend_id
from app.remote.endpoint_book import EndpointBook
from app.window.menus import MenuId, Menus
from engine.errors import StudioError
from engine.remote.client import RemoteClient
from engine.remote.endpoints import Endpoint
from engine.remote.metrics import RemoteMetricsSnapshot
from engine.remote.urls import cleartext_warning
from engine.serve.cross_site import check_origins
from widgets.dialogs.endpoint import EndpointDialog
from widgets.dialogs.server import ServerDialog, ServerValues
from widgets.model.backend_picker import BackendPicker
from widgets.notice_bar import ERROR, INFO, NoticeBar

if TYPE_CHECKING:
    from app.chat.event_pump import EventPump
    from app.chat.tabs import ChatTabs
    from app.hosting.backends import BackendRegistry
    from app.hosting.engine_bridge import EngineBridge
    from app.window.settings import StudioSettings

log = logging.getLogger(__name__)

REMOTE_STATUS_MS = 1000


def list_endpoint_models(base_url: str, api_key: str | None) -> list[str]:
    """The add-endpoint dialog's model lister (runs off the UI thread)."""
    with RemoteClient(base_url, api_key=api_key, connect_timeout_s=5, read_timeout_s=20) as client:
        return client.list_models()


def describe_remote_metrics(label: str, snapshot: RemoteMetricsSnapshot | None) -> str:
    if snapshot is None:
        return f"{label} · reading its metrics…"
    if not snapshot.available:
        return f"{label} · only client-side timings are available"
    parts = [label]
    if snapshot.kv_cache_usage is not None:
        parts.append(f"KV {snapshot.kv_cache_usage:.0%}")
    if snapshot.running is not None:
        parts.append(f"running {snapshot.running:.0f} · waiting {snapshot.waiting or 0:.0f}")
    ttft = snapshot.ttft_mean_s if snapshot.ttft_mean_s is not None else snapshot.ttft_mean_total_s
    if ttft is not None:
        parts.append(f"TTFT {ttft * 1000:.0f} ms")
    elif snapshot.generation_tokens_per_s is not None:
        parts.append(f"{snapshot.generation_tokens_per_s:.0f} tok/s")
    return " · ".join(parts)


@dataclass(frozen=True)
class RemoteHost:
    """What the remote features use of the window they live in."""

    parent: QWidget  # of their dialogs and actions
    settings: StudioSettings
    registry: BackendRegistry
    pump: EventPump
    bridge: EngineBridge
    tabs: ChatTabs
    notice: NoticeBar
    status: QStatusBar
    toolbar: QToolBar
    picker_anchor: QAction  # the endpoint picker goes in front of it
    menus: Menus
    confirm: Callable[[str, str], bool]


class RemoteFeatures(QObject):
    """Hook for the dashboard: `remote_client_changed` fires with the current chat's RemoteClient (None when the
    chat uses this computer's engine). Its `metrics.snapshot` is a dashboard SnapshotSource of client-side token
    timings; its `latest_metrics` (RemoteMetricsSnapshot, refreshed every second while the chat is current) holds
    what the server itself reports, or says that only client-side timings are available."""

    remote_client_changed = Signal(object)  # RemoteClient | None

    def __init__(self, host: RemoteHost) -> None:
        super().__init__(host.parent)
        self.host = host
        qsettings = host.settings.qsettings
        self.book = EndpointBook(qsettings)
        self.backends = RemoteBackends(self.book, host.registry)
        self.server_settings = ServerSettings(qsettings)
        self.server = ApiServerControl(host.bridge, self.server_settings, self)
        self.server.state_changed.connect(self._on_server_state)
        self.server.failed.connect(self._on_server_failed)
        self._polled: RemoteClient | None = None

        self.picker = BackendPicker()
        self.picker.backend_chosen.connect(self.choose_backend)
        self.picker.add_requested.connect(self.add_endpoint_dialog)
        # right after "New chat": the first thing to see of a chat is which model it talks to, and a toolbar
        # too narrow for all its items (a large font) drops the last ones into its overflow menu, not this one
        host.toolbar.insertWidget(host.picker_anchor, self.picker)
        self.server_label = QLabel()
        self.server_label.setObjectName("serverStatus")
        self.server_label.setToolTip("The OpenAI-compatible API the studio serves (Server menu)")
        self.remote_label = QLabel()
        self.remote_label.setObjectName("remoteStatus")
        self.remote_label.setToolTip("What the current chat's remote endpoint reports")
        host.status.addPermanentWidget(self.remote_label)
        host.status.addPermanentWidget(self.server_label)
        self._build_menus()

        host.tabs.current_changed.connect(lambda _controller: self._on_current_changed())
        host.bridge.model_changed.connect(lambda _info: self.refresh_choices())
        self._timer = QTimer(self, interval=REMOTE_STATUS_MS)
        self._timer.timeout.connect(self.refresh_remote_status)
        self._timer.start()
        self.refresh_choices()
        self._on_current_changed()
        self._on_server_state("")

    # ---- menus ------------------------------------------------------------------------------
    def _build_menus(self) -> None:
        window, menus = self.host.parent, self.host.menus
        model_menu = menus.add(MenuId.MODEL, "&Model")
        model_menu.addSeparator()
        self.add_endpoint_action = QAction("Add a remote &endpoint…", window)
        self.add_endpoint_action.setStatusTip("Chat with a model served by vLLM, TGI, Ollama, LM Studio or a studio")
        self.add_endpoint_action.triggered.connect(lambda _checked=False: self.add_endpoint_dialog())
        model_menu.addAction(self.add_endpoint_action)
        self.remove_menu = QMenu("&Remove a remote endpoint", window)
        self.remove_menu.aboutToShow.connect(self._fill_remove_menu)
        model_menu.addMenu(self.remove_menu)

        server_menu = menus.add(MenuId.SERVER, "&Server")
        self.serve_action = QAction("&Serve the OpenAI API", window)
        self.serve_action.setCheckable(True)
        self.serve_action.setShortcut(QKeySequence("Ctrl+Shift+A"))
        self.serve_action.setStatusTip("Let other programs use the loaded model over HTTP, beside these chats")
        self.serve_action.toggled.connect(self.server.set_enabled)
        server_menu.addAction(self.serve_action)
        settings_action = QAction("API server &settings…", window)
        settings_action.triggered.connect(lambda _checked=False: self.server_settings_dialog())
        server_menu.addAction(settings_action)

    def _fill_remove_menu(self) -> None:
        self.remove_menu.clear()
        saved = self.book.all()
        if not saved:
            self.remove_menu.addAction("No endpoints added").setEnabled(False)
        for entry in saved:
            action = self.remove_menu.addAction(f"{entry.name} ({entry.endpoint.base_url})")
            action.triggered.connect(lambda _checked=False, name=entry.name: self.remove_endpoint(name))

    # ---- endpoints --------------------------------------------------------------------------
    def add_endpoint_dialog(self) -> None:
        taken = {s.name for s in self.book.all()}
        dialog = EndpointDialog(list_endpoint_models, taken, self.host.parent, url_warning=cleartext_warning)
        if dialog.exec() != EndpointDialog.DialogCode.Accepted:
            return
        values = dialog.values()
        self.add_endpoint(values.name, values.base_url, values.api_key, list(values.models))

    def add_endpoint(self, name: str, base_url: str, api_key: str, models: list[str]) -> bool:
        """Save an endpoint (its key to the keyring) and move the current chat to its first model."""
        try:
            saved = self.backends.add(Endpoint(name, base_url), models, api_key or "")
        except StudioError as exc:
            self.host.notice.show_message(f"Could not add the endpoint: {exc}", ERROR)
            return False
        self.refresh_choices()
        if saved.models:
            self.choose_backend(remote_backend_id(saved.name, saved.models[0]))
        self.host.notice.show_message(f"Added “{saved.name}”: choose its models per chat in the toolbar.", INFO)
        return True

    def remove_endpoint(self, name: str) -> None:
        users = [c for c in self.host.tabs.controllers if (parse_backend_id(c.backend_id) or ("",))[0] == name]
        if any(c.busy for c in users) and not self.host.confirm(
            "Remove endpoint", f"Chats are writing replies on “{name}”. Stop them and remove it?"
        ):
            return
        self.backends.remove(name)
        for controller in users:
            if not controller.busy:  # a chat still stopping keeps its (now unavailable) endpoint until it ends
                controller.set_backend(LOCAL)
        self.refresh_choices()
        self._on_current_changed()

    # ---- per-chat backend -------------------------------------------------------------------
    def refresh_choices(self) -> None:
        info = self.host.bridge.info
        local = f"This computer: {info.name}" if info is not None else "This computer"
        self.picker.set_choices([(LOCAL, local), *self.backends.choices()])

    def choose_backend(self, backend_id: str) -> None:
        controller = self.host.tabs.current
        if controller is None:
            return
        if not controller.set_backend(backend_id):
            self.picker.set_current(controller.backend_id)
            controller.panel.show_info("A reply is still being written: stop it (Esc) or wait, then switch the model.")
            return
        self.picker.set_current(backend_id)
        self._on_current_changed()

    def _on_current_changed(self) -> None:
        controller = self.host.tabs.current
        backend_id = controller.backend_id if controller is not None else LOCAL
        self.picker.set_current(backend_id)
        client = self.backends.client(backend_id)
        if client is not self._polled:
            if self._polled is not None and self._polled.alive:
                self._polled.poll_metrics(None)
            self._polled = client
            if client is not None:
                client.poll_metrics(REMOTE_STATUS_MS / 1000)
            self.remote_client_changed.emit(client)
        self.refresh_remote_status()

    def current_client(self) -> RemoteClient | None:
        """The current chat's remote client, or None when it talks to this computer's engine."""
        return self._polled

    def refresh_remote_status(self) -> None:
        client = self._polled
        self.remote_label.setVisible(client is not None)
        if client is not None:
            self.remote_label.setText(describe_remote_metrics(f"{client.model} @ {client.name}", client.latest_metrics))

    # ---- API server -------------------------------------------------------------------------
    def server_settings_dialog(self) -> None:
        s = self.server_settings
        current = ServerValues(s.port, s.require_key, tuple(s.allowed_origins))
        dialog = ServerDialog(current, ServerKeys(), self.host.parent, check_origins=check_origins)
        if dialog.exec() != ServerDialog.DialogCode.Accepted:
            return
        values = dialog.values()
        changed = values != current or dialog.key_changed
        s.port, s.require_key, s.allowed_origins = values.port, values.require_key, list(values.allowed_origins)
        self.host.settings.sync()
        if self.server.enabled and changed:  # apply now: the old server lets the port go, a new one takes it
            self.server.restart()

    def _on_server_state(self, url: str) -> None:
        if url:
            key = "key required" if self.server_settings.require_key else "no key"
            self.server_label.setText(f"API :{urlsplit(url).port} ({key})")
            self.server_label.setToolTip(f"Serving the loaded model at {url}")
        elif self.server.enabled:
            self.server_label.setText("API: waiting for the model")
        else:
            self.server_label.setText("")
        self.server_label.setVisible(bool(self.server_label.text()))
        if self.serve_action.isChecked() != self.server.enabled:
            self.serve_action.setChecked(self.server.enabled)

    def _on_server_failed(self, message: str) -> None:
        self.host.notice.show_message(message, ERROR, ("Server settings…", self.server_settings_dialog))

    def shutdown(self) -> None:
        self._timer.stop()
        self.server.shutdown()
        self.backends.shutdown()
