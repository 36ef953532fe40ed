"""ModelPickerDialog: choose a model source, dtype, quantization, device and KV budget, with the loader's estimate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.domain.model_choice import ModelChoice
from engine.load.estimate import MemoryEstimate
from widgets.background import BackgroundCall
from widgets.model.estimate_box import EstimateBox
from widgets.model.source_box import HUB, ModelSourceBox


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

    def auto_kv_budget(self, estimate: MemoryEstimate, free: int) -> int: ...  # the engine's automatic KV budget

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
        self.estimate_result: MemoryEstimate | None = None
        self.estimate_error: str | None = None
        self.problem: str | None = None
        self._estimator = BackgroundCall(self)
        self._estimator.succeeded.connect(self._on_estimate)
        self._estimator.failed.connect(self._on_estimate_failed)
        self._debounce = QTimer(self, singleShot=True, interval=300)
        self._debounce.timeout.connect(self._start_estimate)

        layout = QVBoxLayout(self)
        self.sources = ModelSourceBox(recent, advisor.hub_token_stored())
        self.radios = self.sources.radios
        self.sources.changed.connect(self._inputs_changed)
        self.sources.recent_chosen.connect(self._set_options)
        layout.addWidget(self.sources)
        layout.addWidget(self._build_options())
        self.reason = QLabel()
        self.reason.setObjectName("fitsWarning")
        self.reason.setWordWrap(True)
        layout.addWidget(self.reason)
        self.estimate_box = EstimateBox()
        self.estimate_box.button.clicked.connect(self._start_estimate)
        # short names for what the dialog and its tests look at
        self.estimate_labels = self.estimate_box.labels
        self.fits = self.estimate_box.fits
        self.estimate_button = self.estimate_box.button
        layout.addWidget(self.estimate_box)
        self.make_default = QCheckBox("Load this model when the studio starts")
        layout.addWidget(self.make_default)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.load_button = self.buttons.addButton("Load", QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.resize(620, 0)
        self.sources.set_spec(initial.spec)
        self._set_options(initial)
        self._inputs_changed()

    # ---- building ---------------------------------------------------------------------------
    def _build_options(self) -> QGroupBox:
        box = QGroupBox("Precision, device and KV cache")
        form = QFormLayout(box)
        self.device = QComboBox()
        self.device.addItems(list(self.advisor.devices))
        self.dtype = QComboBox()
        self.dtype.addItems(list(self.advisor.dtypes))
        self.quantization = QComboBox()
        self.quantization.addItems(list(self.advisor.quantizations))
        self.quantization.setToolTip(
            "int8, int4: the engine's own weight-only kernels on a CPU (used where measured faster); nf4, fp4 (and "
            "int8 on a GPU): bitsandbytes. The estimate below says what the choice does to decode speed here."
        )
        self.kv_mib = QSpinBox()
        self.kv_mib.setRange(0, 1024 * 1024)
        self.kv_mib.setSingleStep(128)
        self.kv_mib.setSuffix(" MiB")
        self.kv_mib.setSpecialValueText("auto")  # 0: worked out from the model and the free memory (shown below)
        self.kv_mib.setToolTip(
            "memory for the paged KV cache: how many tokens all chats together can hold; auto: 16,384 tokens of this "
            "model's KV, at most half the memory free beside it"
        )
        form.addRow("Device", self.device)
        form.addRow("Data type", self.dtype)
        form.addRow("Quantization", self.quantization)
        form.addRow("KV cache", self.kv_mib)
        for combo in (self.device, self.dtype, self.quantization):
            combo.currentIndexChanged.connect(self._inputs_changed)
        self.kv_mib.valueChanged.connect(self._inputs_changed)
        return box

    # ---- the choice -------------------------------------------------------------------------
    @property
    def source(self) -> str:
        return self.sources.source

    def spec(self) -> str:
        return self.sources.spec()

    def choice(self) -> ModelChoice:
        return ModelChoice(
            spec=self.spec(),
            dtype=self.dtype.currentText(),
            quantization=self.quantization.currentText(),
            device=self.device.currentText(),
            kv_memory_mib=self.kv_mib.value(),
        )

    def _set_options(self, choice: ModelChoice) -> None:
        self.device.setCurrentText(choice.device)
        self.dtype.setCurrentText(choice.dtype)
        self.quantization.setCurrentText(choice.quantization)
        self.kv_mib.setValue(choice.kv_memory_mib)

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
        self.estimate_box.show_pending()
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
        return self.estimate_result.total_bytes(self.kv_budget(free)) <= free

    def kv_budget(self, free: int) -> int:
        """The KV budget chosen, or the automatic one for the estimated model and this much free memory."""
        if self.kv_mib.value() or self.estimate_result is None:
            return self.kv_mib.value() * 1024**2
        return self.advisor.auto_kv_budget(self.estimate_result, free)

    def _show_estimate(self) -> None:
        if self.estimate_result is None:
            self.estimate_box.clear(self.estimate_error)
        else:
            free, what = self.advisor.free_memory(self.device.currentText())
            auto = not self.kv_mib.value()
            self.estimate_box.show_estimate(self.estimate_result, self.kv_budget(free), free, what, auto_kv=auto)
        self._fit_height()

    # ---- size -------------------------------------------------------------------------------
    def _fit_height(self) -> None:
        """At least as tall as the wrapped text needs at this width: a dialog's minimum size counts a word-wrapped
        label as one line, so every estimate that wraps had its second line cut off at the default size."""
        layout = self.layout()
        needed = layout.totalHeightForWidth(self.width()) if layout.hasHeightForWidth() else 0
        if needed and needed != self.minimumHeight():
            self.setMinimumHeight(needed)  # grows the dialog if it is shorter; a wider one may be shorter again

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self._fit_height()

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
