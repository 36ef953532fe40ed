"""ModelSourceBox: where a model comes from: the embedded one, a recent choice, a folder, a .gguf file, a hub repo."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QWidget,
)

from engine.domain.model_choice import ModelChoice

EMBEDDED, RECENT, FOLDER, GGUF, HUB = "embedded", "recent", "folder", "gguf", "hub"
SOURCES = {
    EMBEDDED: "Embedded default",
    RECENT: "Recently used",
    FOLDER: "Local folder",
    GGUF: "GGUF file",
    HUB: "Hub repository",
}


def source_of(spec: str) -> str:
    """Which source a spec belongs to (for showing a stored choice)."""
    spec = spec.strip()
    if spec.lower() in ("", "default", "embedded"):
        return EMBEDDED
    if spec.lower().endswith(".gguf"):
        return GGUF
    if spec.startswith(("/", ".", "~")) or "\\" in spec or ":" in spec:
        return FOLDER
    return HUB


class ModelSourceBox(QGroupBox):
    changed = Signal()  # the source or its text changed
    recent_chosen = Signal(object)  # the ModelChoice picked from the recent list (its options come along)

    def __init__(self, recent: Sequence[ModelChoice], hub_token_stored: bool, parent: QWidget | None = None) -> None:
        super().__init__("Model", parent)
        self.recent_choices = list(recent)
        grid = QGridLayout(self)
        self._group = QButtonGroup(self)
        self.radios: dict[str, QRadioButton] = {}
        for row, (key, text) in enumerate(SOURCES.items()):
            radio = QRadioButton(text)
            self.radios[key] = radio
            self._group.addButton(radio)
            grid.addWidget(radio, row, 0)
            radio.toggled.connect(lambda checked, k=key: checked and self._on_source(k))
        grid.addWidget(QLabel("SmolLM2-135M-Instruct, bundled with the studio; works offline"), 0, 1, 1, 2)
        self.recent = QComboBox()
        self.recent.addItems([choice.label for choice in self.recent_choices])
        self.recent.currentIndexChanged.connect(self._recent_selected)
        self.radios[RECENT].setEnabled(bool(self.recent_choices))
        self.recent.setEnabled(bool(self.recent_choices))
        grid.addWidget(self.recent, 1, 1, 1, 2)
        self.edits = {
            FOLDER: QLineEdit(placeholderText="a folder with config.json and *.safetensors"),
            GGUF: QLineEdit(placeholderText="a .gguf file"),
            HUB: QLineEdit(placeholderText="org/name or org/name@revision"),
        }
        browsers = {FOLDER: self._browse_folder, GGUF: self._browse_gguf}
        for row, (key, edit) in enumerate(self.edits.items(), start=2):
            grid.addWidget(edit, row, 1, 1, 1 if key in browsers else 2)
            edit.textEdited.connect(lambda _text, k=key: self._select(k))
            if key in browsers:
                button = QPushButton("Browse…")
                button.clicked.connect(browsers[key])
                grid.addWidget(button, row, 2)
        note = "Uses the hub token from Settings." if hub_token_stored else "No hub token stored: public repos only."
        self.hub_note = QLabel(note)
        self.hub_note.setObjectName("hint")
        self.hub_note.setToolTip(
            "Downloaded into the Hugging Face cache. Private and gated repositories need a token (Settings)."
        )
        grid.addWidget(self.hub_note, len(SOURCES), 1, 1, 2)
        grid.setColumnStretch(1, 1)

    @property
    def source(self) -> str:
        return next((key for key, radio in self.radios.items() if radio.isChecked()), EMBEDDED)

    def spec(self) -> str:
        source = self.source
        if source == RECENT and self.recent_choices:
            return self.recent_choices[self.recent.currentIndex()].spec
        if source in self.edits:
            return self.edits[source].text().strip()
        return "default"

    def set_spec(self, spec: str) -> None:
        source = source_of(spec)
        if source in self.edits:
            self.edits[source].setText(spec.strip())
        self.radios[source].setChecked(True)

    def _on_source(self, key: str) -> None:
        if key == RECENT and self.recent_choices:  # a recent entry brings its dtype, device and KV budget
            self.recent_chosen.emit(self.recent_choices[self.recent.currentIndex()])
        self.changed.emit()

    def _select(self, key: str) -> None:
        if self.radios[key].isChecked():
            self.changed.emit()  # same source, new text
        else:
            self.radios[key].setChecked(True)

    def _recent_selected(self, index: int) -> None:
        if 0 <= index < len(self.recent_choices):
            if self.radios[RECENT].isChecked():
                self.recent_chosen.emit(self.recent_choices[index])
            self._select(RECENT)

    def _browse_folder(self) -> None:
        edit = self.edits[FOLDER]
        folder = QFileDialog.getExistingDirectory(self, "Choose a Hugging Face model folder", edit.text())
        if folder:
            edit.setText(folder)
            self._select(FOLDER)

    def _browse_gguf(self) -> None:
        edit = self.edits[GGUF]
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", edit.text(), "GGUF models (*.gguf)")
        if path:
            edit.setText(path)
            self._select(GGUF)
