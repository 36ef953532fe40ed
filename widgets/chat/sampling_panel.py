"""SamplingPanel: a chat's system prompt and sampling settings, with the precise / balanced / creative presets."""

from __future__ import annotations

from PySide6.QtCore import QSignalBlocker, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from widgets.chat.data import OVERFLOW_POLICIES, OVERFLOW_STOP, PRESETS, ChatSettings

CUSTOM = "custom"


def _double(minimum: float, maximum: float, step: float, tip: str) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(minimum, maximum)
    box.setSingleStep(step)
    box.setDecimals(2)
    box.setToolTip(tip)
    return box


class SamplingPanel(QWidget):
    settings_changed = Signal(object)  # ChatSettings

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("samplingPanel")
        self.preset = QComboBox()
        self.preset.addItems([*PRESETS, CUSTOM])
        self.preset.setToolTip("precise: greedy, repeatable; balanced: everyday chat; creative: more varied")
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("Optional: how the assistant should behave")
        self.system_prompt.setMaximumHeight(110)
        self.temperature = _double(0.0, 2.0, 0.05, "0 picks the most likely token every time (greedy)")
        self.top_p = _double(0.01, 1.0, 0.01, "sample only from the smallest set of tokens holding this probability")
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setSpecialValueText("off")
        self.top_k.setToolTip("sample only from the k most likely tokens (0 = off)")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        self.max_tokens.setToolTip("longest reply, in tokens")
        self.seed = QSpinBox()
        self.seed.setRange(-1, 2**31 - 1)
        self.seed.setSpecialValueText("random")
        self.seed.setToolTip("a fixed seed makes sampled replies repeatable (-1 = random)")
        self.repetition_penalty = _double(0.5, 2.0, 0.05, "above 1 discourages repeating tokens already present")
        self.overflow = QComboBox()
        for key, label in OVERFLOW_POLICIES.items():
            self.overflow.addItem(label, key)
        self.overflow.setToolTip(
            "When the conversation outgrows the model's context: stop and say so; truncate the middle (keep the "
            "system prompt and the first exchange, drop whole turns after it); or a rolling window (keep the "
            "system prompt and the latest turns). The transcript marks what was left out."
        )

        form = QFormLayout()
        form.addRow("Preset", self.preset)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Seed", self.seed)
        form.addRow("Repetition penalty", self.repetition_penalty)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        title = QLabel("System prompt")
        title.setObjectName("sectionTitle")
        layout.addWidget(title)
        layout.addWidget(self.system_prompt)
        sampling = QLabel("Sampling")
        sampling.setObjectName("sectionTitle")
        layout.addWidget(sampling)
        layout.addLayout(form)
        context = QLabel("Context")
        context.setObjectName("sectionTitle")
        layout.addWidget(context)
        overflow_form = QFormLayout()
        overflow_form.addRow("When full", self.overflow)
        layout.addLayout(overflow_form)
        layout.addStretch(1)

        # typing a system prompt should not write the store on every key press
        self._prompt_timer = QTimer(self, singleShot=True, interval=400)
        self._prompt_timer.timeout.connect(self._emit)
        self.system_prompt.textChanged.connect(self._prompt_timer.start)
        self.preset.currentTextChanged.connect(self._apply_preset)
        for box in (self.temperature, self.top_p, self.repetition_penalty):
            box.valueChanged.connect(self._on_value)
        for box in (self.top_k, self.max_tokens, self.seed):
            box.valueChanged.connect(self._on_value)
        self.overflow.currentIndexChanged.connect(self._on_value)
        self.set_settings(ChatSettings())

    def settings(self) -> ChatSettings:
        seed = self.seed.value()
        return ChatSettings(
            system_prompt=self.system_prompt.toPlainText(),
            temperature=round(self.temperature.value(), 2),
            top_p=round(self.top_p.value(), 2),
            top_k=self.top_k.value(),
            max_tokens=self.max_tokens.value(),
            seed=None if seed < 0 else seed,
            repetition_penalty=round(self.repetition_penalty.value(), 2),
            overflow=self.overflow.currentData() or OVERFLOW_STOP,
        )

    def set_settings(self, settings: ChatSettings) -> None:
        widgets = (self.preset, self.system_prompt, self.temperature, self.top_p, self.top_k, self.max_tokens)
        blockers = [QSignalBlocker(w) for w in (*widgets, self.seed, self.repetition_penalty, self.overflow)]
        if self.system_prompt.toPlainText() != settings.system_prompt:
            self.system_prompt.setPlainText(settings.system_prompt)
        values = (
            (self.temperature, settings.temperature),
            (self.top_p, settings.top_p),
            (self.top_k, settings.top_k),
            (self.max_tokens, settings.max_tokens),
            (self.seed, -1 if settings.seed is None else settings.seed),
            (self.repetition_penalty, settings.repetition_penalty),
        )
        for box, value in values:
            # setting a box to the value it holds would still rewrite its text ("0" -> "0.00") while the user types
            # in it, and the next key ("." of "0.3") would land after the rewritten text and be refused
            if round(box.value(), 4) != round(value, 4):
                box.setValue(value)
        self.overflow.setCurrentIndex(max(0, self.overflow.findData(settings.overflow)))
        self.preset.setCurrentText(settings.preset_name() or CUSTOM)
        del blockers

    def _apply_preset(self, name: str) -> None:
        if name in PRESETS:
            self.set_settings(self.settings().with_preset(name))
            self._emit()

    def _on_value(self, *_args) -> None:
        with QSignalBlocker(self.preset):
            self.preset.setCurrentText(self.settings().preset_name() or CUSTOM)
        self._emit()

    def _emit(self) -> None:
        self._prompt_timer.stop()
        self.settings_changed.emit(self.settings())
