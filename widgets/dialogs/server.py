"""ServerDialog: the studio's own API server: port, an optional API key (kept in the keyring only), and the web pages
allowed to call it from a browser."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.errors import StudioError


class KeyAccess(Protocol):
    def stored(self) -> bool: ...

    def save(self, key: str) -> None: ...


@dataclass(frozen=True)
class ServerValues:
    port: int
    require_key: bool
    allowed_origins: tuple[str, ...] = ()  # web pages that may call the API from a browser (CORS)


def _origins(text: str) -> tuple[str, ...]:
    return tuple(part for part in text.replace(",", " ").split() if part)


class ServerDialog(QDialog):
    def __init__(
        self,
        values: ServerValues,
        keys: KeyAccess,
        parent: QWidget | None = None,
        check_origins: Callable[[tuple[str, ...]], object] | None = None,
    ) -> None:
        """check_origins raises a StudioError naming an origin that is malformed (the server's own check)."""
        super().__init__(parent)
        self.check_origins = check_origins
        self.setWindowTitle("API server")
        self.setObjectName("serverDialog")
        self.keys = keys
        self.key_changed = False  # a new key was saved: a running server must restart to require it
        intro = QLabel(
            "Serves the loaded model over the OpenAI API on this machine (127.0.0.1), sharing the engine with "
            "the open chats; /metrics speaks vLLM's names."
        )
        intro.setWordWrap(True)
        intro.setObjectName("hint")
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(values.port)
        self.require_key = QCheckBox("Require an API key (Authorization: Bearer …)")
        self.require_key.setChecked(values.require_key)
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("a new key (kept in the system keyring)")
        self.key_state = QLabel()
        self.key_state.setObjectName("hint")
        self.key_state.setWordWrap(True)
        self.origins = QLineEdit(" ".join(values.allowed_origins))
        self.origins.setObjectName("allowedOrigins")
        self.origins.setPlaceholderText("none: no web page may call it (e.g. http://localhost:3000)")
        self.origins.setToolTip(
            "Web pages (scheme://host:port, separated by spaces) whose scripts may call the API from a browser "
            "(CORS). * allows every page you open."
        )
        self.origins_state = QLabel()
        self.origins_state.setObjectName("hint")
        self.origins_state.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Port", self.port)
        form.addRow("", self.require_key)
        form.addRow("API key", self.key)
        form.addRow("", self.key_state)
        form.addRow("Allowed web pages", self.origins)
        form.addRow("", self.origins_state)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(self.buttons)
        self.require_key.toggled.connect(lambda _on: self._show_state())
        self.origins.textChanged.connect(lambda _text: self._show_origins_state())
        self._show_state()
        self._show_origins_state()
        self.setMinimumWidth(460)
        self.adjustSize()

    def _show_state(self, text: str | None = None) -> None:
        self.key.setEnabled(self.require_key.isChecked())
        if text is None:
            stored = self.keys.stored()
            text = "A key is stored in the system keyring." if stored else "No key stored yet."
        self.key_state.setText(text)

    def _show_origins_state(self, text: str | None = None) -> None:
        if text is None:
            text = ""
            if "*" in _origins(self.origins.text()):
                text = "* lets every web page you open use the model" + (
                    "." if self.require_key.isChecked() else ", without a key."
                )
        self.origins_state.setText(text)
        self.origins_state.setVisible(bool(text))

    def values(self) -> ServerValues:
        return ServerValues(self.port.value(), self.require_key.isChecked(), _origins(self.origins.text()))

    def accept(self) -> None:
        if self.check_origins is not None:
            try:
                self.check_origins(_origins(self.origins.text()))
            except StudioError as exc:  # a malformed origin: say which, keep the dialog open
                self._show_origins_state(str(exc).replace("--allowed-origin ", ""))
                return
        typed = self.key.text().strip()
        if self.require_key.isChecked() and not typed and not self.keys.stored():
            self._show_state("Enter a key, or untick “Require an API key”.")
            return
        if typed:
            try:
                self.keys.save(typed)
            except StudioError as exc:  # a locked or missing keyring: say so, keep the dialog open
                self._show_state(str(exc))
                return
            self.key_changed = True
            self.key.clear()  # the key lives in the keyring only, not in this widget
        super().accept()
