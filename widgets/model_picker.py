"""ModelPickerDialog: choose a model source, dtype, quantization, device and KV budget, with the loader's estimate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.memory import MemoryEstimate, format_bytes
from widgets.background import BackgroundCall
from widgets.model_choice import ModelChoice

EMBEDDED, RECENT, FOLDER, GGUF, HUB = "embedded", "recent", "folder", "gguf", "hub"


class PickerAdvisor(Protocol):
    """What the dialog asks the app: which options this machine supports, estimates, free memory."""

    dtypes: Sequence[str]
    quantizations: Sequence[str]
    devices: Sequence[str]

    def device_problem(self, device: str) -> str | None: ...

    def dtype_problem(self, dtype: str, device: str) -> str | None: ...

    def quantization_problem(self, quantization: str, device: str, dtype: str) -> str | None: ...

    def estimate(self, choice: ModelChoice) -> MemoryEstimate: ...  # slow: called off the UI thread

    def free_memory(self, device: str) -> tuple[int, str]: ...  # bytes, and what they are ("free RAM")

    def hub_token_stored(self) -> bool: ...


def _set_item_problem(combo: QComboBox, index: int, problem: str | None) -> None:
    item = combo.model().item(index)
    item.setEnabled(problem is None)
    item.setToolTip(problem or "")


class ModelPickerDialog(QDialog):
    def __init__(
        self,
        advisor: PickerAdvisor,
        initial: ModelChoice,
        recent: Sequence[ModelChoice] = (),
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Choose a model")
        self.setObjectName("modelPicker")
        self.advisor = advisor
        self.recent_choices = list(recent)
        self.estimate_result: MemoryEstimate | None = None
        self.estimate_error: str | None = None
        self.problem: str | None = None
        self._estimator = BackgroundCall(self)
        self._estimator.succeeded.connect(self._on_estimate)
        self._estimator.failed.connect(self._on_estimate_failed)
        self._debounce = QTimer(self, singleShot=True, interval=300)
        self._debounce.timeout.connect(self._start_estimate)

        layout = QVBoxLayout(self)
        layout.addWidget(self._build_sources())
        layout.addWidget(self._build_options())
        self.reason = QLabel()
        self.reason.setObjectName("fitsWarning")
        self.reason.setWordWrap(True)
        layout.addWidget(self.reason)
        layout.addWidget(self._build_estimate())
        self.make_default = QCheckBox("Load this model when the studio starts")
        layout.addWidget(self.make_default)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.load_button = self.buttons.addButton("Load", QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.resize(620, 0)
        self._set_choice(initial)
        self._inputs_changed()

    # ---- building ---------------------------------------------------------------------------
    def _build_sources(self) -> QGroupBox:
        box = QGroupBox("Model")
        grid = QGridLayout(box)
        self.source_group = QButtonGroup(self)
        self.radios: dict[str, QRadioButton] = {}
        for row, (key, text) in enumerate(
            [
                (EMBEDDED, "Embedded default"),
                (RECENT, "Recently used"),
                (FOLDER, "Local folder"),
                (GGUF, "GGUF file"),
                (HUB, "Hub repository"),
            ]
        ):
            radio = QRadioButton(text)
            self.radios[key] = radio
            self.source_group.addButton(radio)
            grid.addWidget(radio, row, 0)
            radio.toggled.connect(self._inputs_changed)
        grid.addWidget(QLabel("SmolLM2-135M-Instruct, bundled with the studio; works offline"), 0, 1, 1, 2)
        self.recent = QComboBox()
        for choice in self.recent_choices:
            self.recent.addItem(choice.label)
        self.recent.currentIndexChanged.connect(self._recent_selected)
        self.radios[RECENT].setEnabled(bool(self.recent_choices))
        self.recent.setEnabled(bool(self.recent_choices))
        grid.addWidget(self.recent, 1, 1, 1, 2)
        self.folder = QLineEdit(placeholderText="a folder with config.json and *.safetensors")
        self.gguf = QLineEdit(placeholderText="a .gguf file")
        self.hub = QLineEdit(placeholderText="org/name or org/name@revision")
        for row, (edit, browse) in enumerate(
            [(self.folder, self._browse_folder), (self.gguf, self._browse_gguf), (self.hub, None)], start=2
        ):
            grid.addWidget(edit, row, 1, 1, 2 if browse is None else 1)
            edit.textEdited.connect(lambda _text, e=edit: self._select_source_of(e))
            if browse is not None:
                button = QPushButton("Browse…")
                button.clicked.connect(browse)
                grid.addWidget(button, row, 2)
        stored = self.advisor.hub_token_stored()
        note = "Uses the hub token from Settings." if stored else "No hub token stored: public repos only."
        self.hub_note = QLabel(note)
        self.hub_note.setToolTip(
            "Downloaded into the Hugging Face cache. Private and gated repositories need a token (Settings)."
        )
        self.hub_note.setObjectName("hint")
        grid.addWidget(self.hub_note, 5, 1, 1, 2)
        grid.setColumnStretch(1, 1)
        return box

    def _build_options(self) -> QGroupBox:
        box = QGroupBox("Precision, device and KV cache")
        form = QFormLayout(box)
        self.device = QComboBox()
        self.device.addItems(list(self.advisor.devices))
        self.dtype = QComboBox()
        self.dtype.addItems(list(self.advisor.dtypes))
        self.quantization = QComboBox()
        self.quantization.addItems(list(self.advisor.quantizations))
        self.quantization.setToolTip("bitsandbytes weight quantization: fewer bytes per weight, faster decode")
        self.kv_mib = QSpinBox()
        self.kv_mib.setRange(16, 1024 * 1024)
        self.kv_mib.setSingleStep(128)
        self.kv_mib.setSuffix(" MiB")
        self.kv_mib.setToolTip("memory for the paged KV cache: how many tokens all chats together can hold")
        form.addRow("Device", self.device)
        form.addRow("Data type", self.dtype)
        form.addRow("Quantization", self.quantization)
        form.addRow("KV cache", self.kv_mib)
        for combo in (self.device, self.dtype, self.quantization):
            combo.currentIndexChanged.connect(self._inputs_changed)
        self.kv_mib.valueChanged.connect(self._inputs_changed)
        return box

    def _build_estimate(self) -> QGroupBox:
        box = QGroupBox("Estimate")
        box.setObjectName("estimateBox")
        grid = QGridLayout(box)
        self.estimate_labels: dict[str, QLabel] = {}
        for row, (key, text) in enumerate(
            [
                ("weights", "Weights"),
                ("kv_token", "KV cache per token"),
                ("context", "Tokens that fit in the KV cache"),
                ("memory", "Memory"),
            ]
        ):
            grid.addWidget(QLabel(text), row, 0)
            value = QLabel("–")
            value.setProperty("role", "value")
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.estimate_labels[key] = value
            grid.addWidget(value, row, 1)
        self.fits = QLabel()
        self.fits.setWordWrap(True)
        grid.addWidget(self.fits, 4, 0, 1, 2)
        self.estimate_button = QPushButton("Estimate")
        self.estimate_button.setToolTip("Hub repositories are fetched to read their size; estimate on request")
        self.estimate_button.clicked.connect(self._start_estimate)
        grid.addWidget(self.estimate_button, 5, 1, Qt.AlignmentFlag.AlignRight)
        grid.setColumnStretch(1, 1)
        return box

    # ---- the choice -------------------------------------------------------------------------
    @property
    def source(self) -> str:
        for key, radio in self.radios.items():
            if radio.isChecked():
                return key
        return EMBEDDED

    def spec(self) -> str:
        source = self.source
        if source == RECENT and self.recent_choices:
            return self.recent_choices[self.recent.currentIndex()].spec
        return {EMBEDDED: "default", FOLDER: self.folder.text(), GGUF: self.gguf.text(), HUB: self.hub.text()}.get(
            source, "default"
        ).strip()

    def choice(self) -> ModelChoice:
        return ModelChoice(
            spec=self.spec(),
            dtype=self.dtype.currentText(),
            quantization=self.quantization.currentText(),
            device=self.device.currentText(),
            kv_memory_mib=self.kv_mib.value(),
        )

    def _set_choice(self, choice: ModelChoice) -> None:
        spec = choice.spec.strip()
        if spec in ("", "default", "embedded"):
            self.radios[EMBEDDED].setChecked(True)
        elif spec.lower().endswith(".gguf"):
            self.gguf.setText(spec)
            self.radios[GGUF].setChecked(True)
        elif spec.startswith(("/", ".", "~")) or "\\" in spec or ":" in spec:
            self.folder.setText(spec)
            self.radios[FOLDER].setChecked(True)
        else:
            self.hub.setText(spec)
            self.radios[HUB].setChecked(True)
        self._set_options(choice)

    def _set_options(self, choice: ModelChoice) -> None:
        for combo, value in ((self.device, choice.device), (self.dtype, choice.dtype)):
            combo.setCurrentText(value)
        self.quantization.setCurrentText(choice.quantization)
        self.kv_mib.setValue(choice.kv_memory_mib)

    def _recent_selected(self, index: int) -> None:
        if 0 <= index < len(self.recent_choices):
            self.radios[RECENT].setChecked(True)
            self._set_options(self.recent_choices[index])

    def _select_source_of(self, edit: QLineEdit) -> None:
        key = {id(self.folder): FOLDER, id(self.gguf): GGUF, id(self.hub): HUB}[id(edit)]
        if not self.radios[key].isChecked():
            self.radios[key].setChecked(True)
        self._inputs_changed()

    def _browse_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose a Hugging Face model folder", self.folder.text())
        if folder:
            self.folder.setText(folder)
            self._select_source_of(self.folder)

    def _browse_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", self.gguf.text(), "GGUF models (*.gguf)")
        if path:
            self.gguf.setText(path)
            self._select_source_of(self.gguf)

    # ---- validation and estimate ------------------------------------------------------------
    def _refresh_option_states(self) -> str | None:
        """Grey out what this machine can't do (the reason in the tooltip); the current choice's problem, if any."""
        device = self.device.currentText()
        dtype = self.dtype.currentText()
        for index in range(self.device.count()):
            _set_item_problem(self.device, index, self.advisor.device_problem(self.device.itemText(index)))
        for index in range(self.dtype.count()):
            _set_item_problem(self.dtype, index, self.advisor.dtype_problem(self.dtype.itemText(index), device))
        for index in range(self.quantization.count()):
            name = self.quantization.itemText(index)
            _set_item_problem(self.quantization, index, self.advisor.quantization_problem(name, device, dtype))
        problems = [
            self.advisor.device_problem(device),
            self.advisor.dtype_problem(dtype, device),
            self.advisor.quantization_problem(self.quantization.currentText(), device, dtype),
        ]
        return next((p for p in problems if p), None)

    def _inputs_changed(self, *_args) -> None:
        self.problem = self._refresh_option_states()
        if not self.problem and not self.spec():
            self.problem = "Enter a folder, a .gguf file or a hub repository id."
        self.estimate_result = None
        self.estimate_error = None
        self._show_estimate()
        if self.problem is None and self.source != HUB:
            self._debounce.start()
        else:
            self._debounce.stop()
        self._update_buttons()

    def _start_estimate(self) -> None:
        if self.problem is not None:
            return
        choice = self.choice()
        self.estimate_labels["weights"].setText("estimating…")
        self._estimator.run(lambda: self.advisor.estimate(choice))
        self._update_buttons()

    def _on_estimate(self, estimate: MemoryEstimate) -> None:
        self.estimate_result = estimate
        self.estimate_error = None
        self._show_estimate()
        self._update_buttons()

    def _on_estimate_failed(self, message: str) -> None:
        self.estimate_result = None
        self.estimate_error = message
        self._show_estimate()
        self._update_buttons()

    @property
    def fits_in_memory(self) -> bool | None:
        if self.estimate_result is None:
            return None
        free, _what = self.advisor.free_memory(self.device.currentText())
        return self.estimate_result.total_bytes(self.kv_mib.value() * 1024**2) <= free

    def _show_estimate(self) -> None:
        labels = self.estimate_labels
        estimate = self.estimate_result
        self.fits.setObjectName("fitsOk")
        if estimate is None:
            for label in labels.values():
                label.setText("–")
            self.fits.setText(self.estimate_error or "")
            if self.estimate_error:
                self.fits.setObjectName("fitsWarning")
        else:
            kv_bytes = self.kv_mib.value() * 1024**2
            tokens = estimate.kv_tokens_for(kv_bytes)
            context = estimate.shape.context_length
            free, what = self.advisor.free_memory(self.device.currentText())
            total = estimate.total_bytes(kv_bytes)
            quant = "" if estimate.quantization == "none" else f", {estimate.quantization}"
            labels["weights"].setText(f"{format_bytes(estimate.weight_bytes)} ({estimate.dtype}{quant})")
            labels["kv_token"].setText(f"{format_bytes(estimate.kv_bytes_per_token)}")
            labels["context"].setText(f"{tokens:,} tokens, shared by all chats (model context {context:,})")
            labels["memory"].setText(f"{format_bytes(total)} needed, {format_bytes(free)} {what}")
            if total <= free:
                self.fits.setText("Fits in memory.")
            else:
                self.fits.setObjectName("fitsWarning")
                self.fits.setText(
                    "Does not fit in free memory: loading may fail or swap heavily. Lower the KV cache, pick a "
                    "smaller data type or quantization, or load anyway."
                )
        self.fits.style().unpolish(self.fits)
        self.fits.style().polish(self.fits)

    def _update_buttons(self) -> None:
        self.reason.setText(self.problem or "")
        self.reason.setVisible(bool(self.problem))
        hub = self.source == HUB
        self.estimate_button.setVisible(hub)
        self.estimate_button.setEnabled(self.problem is None and not self._estimator.running)
        blocked = self.problem is not None or (self.estimate_error is not None and not hub)
        self.load_button.setEnabled(not blocked)
        self.load_button.setText("Load anyway" if self.fits_in_memory is False else "Load")

    def accept(self) -> None:
        if self.load_button.isEnabled():  # Enter in a field must not bypass the refusal
            super().accept()
