"""EndpointDialog: add a remote OpenAI-compatible endpoint: name, base URL, API key (to the keyring), its models."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from widgets.background import BackgroundCall

# (base URL, API key or None) -> the endpoint's model ids; slow (network), called off the UI thread
ModelLister = Callable[[str, str | None], list[str]]
# base URL as typed -> a warning about it (an API key would travel in clear text), or None
UrlWarning = Callable[[str], str | None]


@dataclass(frozen=True)
class EndpointValues:
    name: str
    base_url: str
    api_key: str  # what was typed; "" = no key. Saved to the keyring by the caller, never kept here.
    models: tuple[str, ...]  # the models the user ticked


class EndpointDialog(QDialog):
    def __init__(
        self,
        list_models: ModelLister,
        taken_names: set[str] = frozenset(),
        parent: QWidget | None = None,
        url_warning: UrlWarning = lambda _url: None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Add a remote endpoint")
        self.setObjectName("endpointDialog")
        self._list_models = list_models
        self._taken = set(taken_names)
        self._url_warning = url_warning
        self._lister = BackgroundCall(self)
        self._lister.succeeded.connect(self._on_models)
        self._lister.failed.connect(self._on_failed)

        intro = QLabel(
            "Chats can run on any OpenAI-compatible server: vLLM on a GPU cluster, TGI, Ollama, LM Studio or "
            "another studio. The API key goes to the system keyring, never to a file."
        )
        intro.setWordWrap(True)
        intro.setObjectName("hint")
        self.name = QLineEdit(placeholderText="e.g. gpu cluster")
        self.base_url = QLineEdit(placeholderText="http://gpu-node:8000/v1")
        self.api_key = QLineEdit(placeholderText="optional")
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.connect_button = QPushButton("Connect and list models")
        self.connect_button.clicked.connect(self.fetch_models)
        self.models = QListWidget()
        self.models.setMinimumHeight(120)
        self.models.itemChanged.connect(lambda _item: self._update_ok())
        self.state = QLabel("Enter the base URL, then list its models.")
        self.state.setWordWrap(True)
        self.state.setObjectName("hint")
        self.url_warning = QLabel()
        self.url_warning.setObjectName("inlineError")
        self.url_warning.setWordWrap(True)
        self.url_warning.hide()
        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("Base URL", self.base_url)
        form.addRow("", self.url_warning)
        form.addRow("API key", self.api_key)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(self.connect_button)
        layout.addWidget(self.models, 1)
        layout.addWidget(self.state)
        layout.addWidget(self.buttons)
        self.name.textChanged.connect(lambda _text: self._update_ok())
        self.base_url.textEdited.connect(lambda _text: self._clear_models())
        self.base_url.textChanged.connect(lambda _text: self._show_url_warning())
        self.resize(520, 0)
        self._update_ok()

    def _show_url_warning(self) -> None:
        warning = self._url_warning(self.base_url.text().strip())
        self.url_warning.setText(warning or "")
        self.url_warning.setVisible(bool(warning))

    def fetch_models(self) -> None:
        url = self.base_url.text().strip()
        if not url:
            self.state.setText("Enter the base URL first.")
            return
        self.connect_button.setEnabled(False)
        self.state.setText(f"Asking {url} for its models…")
        key = self.api_key.text().strip() or None
        self._lister.run(lambda: self._list_models(url, key))

    def _on_models(self, models: object) -> None:
        self.connect_button.setEnabled(True)
        self._clear_models()
        names = [str(m) for m in models]  # type: ignore[union-attr]
        for index, name in enumerate(names):
            item = QListWidgetItem(name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if index == 0 else Qt.CheckState.Unchecked)
            self.models.addItem(item)
        self.state.setText(
            f"{len(names)} model(s) found; tick the ones to offer in the chats." if names else "It serves no models."
        )
        if not self.name.text().strip():
            self.name.setText(self._suggest_name())
        self._update_ok()

    def _on_failed(self, message: str) -> None:
        self.connect_button.setEnabled(True)
        self._clear_models()
        self.state.setText(f"Could not list the models: {message}")

    def _clear_models(self) -> None:
        self.models.clear()
        self._update_ok()

    def _suggest_name(self) -> str:
        from urllib.parse import urlsplit

        text = self.base_url.text().strip()
        host = urlsplit(text if "://" in text else "http://" + text).hostname or "remote"
        name, number = host, 2
        while name in self._taken:
            name, number = f"{host} {number}", number + 1
        return name

    def ticked(self) -> tuple[str, ...]:
        items = (self.models.item(i) for i in range(self.models.count()))
        return tuple(item.text() for item in items if item.checkState() == Qt.CheckState.Checked)

    def _problem(self) -> str | None:
        name = self.name.text().strip()
        if not name:
            return "Give the endpoint a name."
        if name in self._taken:
            return f"An endpoint named “{name}” exists already."
        if not self.ticked():
            return "List the models and tick at least one."
        return None

    def _update_ok(self) -> None:
        problem = self._problem()
        self.buttons.button(QDialogButtonBox.StandardButton.Save).setEnabled(problem is None)
        self.buttons.button(QDialogButtonBox.StandardButton.Save).setToolTip(problem or "")

    def values(self) -> EndpointValues:
        return EndpointValues(self.name.text().strip(), self.base_url.text().strip(), self.api_key.text().strip(),
                              self.ticked())  # fmt: skip
