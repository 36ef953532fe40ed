"""ApiServerControl: the window's toggle for the OpenAI-compatible server over the engine the chats use."""

from __future__ import annotations

import logging
import threading

from PySide6.QtCore import QObject, Signal

from app.hosting.engine_bridge import EngineBridge
from app.hosting.server_settings import ServerSettings
from engine.errors import StudioError
from engine.serve.local_server import LocalApiServer
from widgets.background import BackgroundCall

log = logging.getLogger(__name__)


class ApiServerControl(QObject):
    """On: serves the live engine now, or as soon as a model is loaded; a model swap moves the server to the new
    engine (same port). Off: API requests are cancelled and the port is released; the chats are unaffected."""

    state_changed = Signal(str)  # the base URL served ("http://127.0.0.1:8000/v1"), "" when not serving
    failed = Signal(str)

    def __init__(self, bridge: EngineBridge, settings: ServerSettings, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.settings = settings
        self.enabled = False
        self.server: LocalApiServer | None = None
        self._starter = BackgroundCall(self)
        self._starter.succeeded.connect(self._on_started)
        self._starter.failed.connect(self._on_failed)
        self._restarter = BackgroundCall(self)
        self._restarter.succeeded.connect(lambda _result: self._start() if self.enabled else None)
        self._restarter.failed.connect(self._on_failed)
        bridge.model_changed.connect(lambda _info: self.restart())

    @property
    def url(self) -> str:
        """The base URL clients use, once the server accepts requests; "" otherwise."""
        server = self.server
        return f"{server.url}/v1" if server is not None and server.http.started else ""

    def set_enabled(self, on: bool) -> None:
        if on == self.enabled:
            return
        self.enabled = on
        if on:
            self._start()
        else:
            self._stop()

    def _start(self) -> None:
        thread, info = self.bridge.thread, self.bridge.info
        if thread is None or info is None:
            self.state_changed.emit("")  # starts when the model is loaded (model_changed)
            return
        try:
            # binding here, in the UI thread, makes a taken port an immediate, clear error
            server = LocalApiServer(
                thread,
                info.name,
                port=self.settings.port,
                api_key=self.settings.api_key(),
                allowed_origins=self.settings.allowed_origins,
            )
        except StudioError as exc:
            self._on_failed(str(exc))
            return
        self.server = server
        self._starter.run(lambda: server.start())

    def _on_started(self, server: object) -> None:
        if server is self.server and self.enabled:
            log.info("API server on %s", self.url)
            self.state_changed.emit(self.url)

    def _on_failed(self, message: str) -> None:
        self.server = None
        self.enabled = False
        self.failed.emit(f"The API server could not start: {message}")
        self.state_changed.emit("")

    def _stop(self, wait: bool = False) -> None:
        server, self.server = self.server, None
        if server is not None:
            # stopping waits for uvicorn's shutdown: off the UI thread unless the window is closing
            stopper = threading.Thread(target=server.stop, name="api-server-stop", daemon=True)
            stopper.start()
            if wait:
                stopper.join(15)
        self.state_changed.emit("")

    def restart(self) -> None:
        """Serve again with the settings as they are now (a new port or key), or a new engine that took over. The old
        server lets its port go before the new one binds it."""
        if not self.enabled:
            return
        old, self.server = self.server, None
        if old is None:
            self._start()
            return
        self.state_changed.emit("")
        # the old server releases the port (its API requests are cancelled) before the new one binds it
        self._restarter.run(old.stop)

    def shutdown(self) -> None:
        self.enabled = False
        self._stop(wait=True)
