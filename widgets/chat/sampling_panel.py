"""SamplingPanel: a chat's system prompt and sampling settings, with the precise / balanced / creative presets, and
what its replies must be (free text, JSON, JSON following a schema checked as it is typed) and whether they carry
token probabilities."""

from __future__ import annotations

from PySide6.QtCore import QSignalBlocker, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QTextOption
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.domain.chat import PRESETS, TOKEN_ALTERNATIVES, ChatSettings, OutputKind, OverflowPolicy
from engine.domain.json_schema import schema_problem

CUSTOM = "custom"


def _double(minimum: float, maximum: float, step: float, tip: str) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(minimum, maximum)
    box.setSingleStep(step)
    box.setDecimals(2)
    box.setToolTip(tip)
    return box


def _choices(options: type[OverflowPolicy] | type[OutputKind], tip: str) -> QComboBox:
    """A combo box of the options' labels whose item data are their values (plain text, as stored)."""
    box = QComboBox()
    for option in options:
        box.addItem(option.label, option.value)
    box.setToolTip(tip)
    return box


def _section_title(text: str) -> QLabel:
    title = QLabel(text)
    title.setObjectName("sectionTitle")
    return title


class SamplingPanel(QWidget):
    settings_changed = Signal(object)  # ChatSettings

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("samplingPanel")
        self._build_sampling_boxes()
        self._build_context_and_output()
        self._build_schema_editor()
        self._lay_out()
        self._connect()
        self.set_settings(ChatSettings())
        self._show_schema_state()

    def _build_sampling_boxes(self) -> None:
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
        self.presence_penalty = _double(-2.0, 2.0, 0.1, "above 0 discourages any token the reply already used "
                                        "(OpenAI's presence penalty; below 0 encourages it)")  # fmt: skip
        self.frequency_penalty = _double(-2.0, 2.0, 0.1, "above 0 discourages a token the more often the reply "
                                         "used it (OpenAI's frequency penalty)")  # fmt: skip

    def _build_context_and_output(self) -> None:
        self.overflow = _choices(
            OverflowPolicy,
            "When the conversation outgrows the model's context: stop and say so; truncate the middle (keep the "
            "system prompt and the first exchange, drop whole turns after it); or a rolling window (keep the "
            "system prompt and the latest turns). The transcript marks what was left out.",
        )
        self.output = _choices(
            OutputKind,
            "Free text: the model writes anything. JSON: every reply is one JSON object. JSON schema: every reply is "
            "JSON that follows the schema below (the engine allows only tokens that keep it valid).",
        )
        self.show_tokens = QCheckBox("Token probabilities")
        self.show_tokens.setToolTip(
            f"Ask for each token's probability and its {TOKEN_ALTERNATIVES} likeliest alternatives; a reply's Tokens "
            "button then shows it token by token (hover a token). Kept while the chat is open, not stored."
        )

    def _build_schema_editor(self) -> None:
        self.schema_editor = QPlainTextEdit()
        self.schema_editor.setObjectName("schemaEditor")
        self.schema_editor.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.schema_editor.setPlaceholderText('{"type": "object",\n "properties": {"answer": {"type": "string"}},\n'
                                              ' "required": ["answer"]}')  # fmt: skip
        self.schema_editor.setTabChangesFocus(True)
        # wrapped: a schema pasted as one line must stay readable in the narrow sidebar (seen in the real window)
        self.schema_editor.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.schema_editor.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.schema_editor.setMinimumHeight(self.schema_editor.fontMetrics().lineSpacing() * 6 + 12)
        self.schema_editor.setMaximumHeight(self.schema_editor.fontMetrics().lineSpacing() * 14 + 12)
        self.schema_editor.setToolTip("A JSON schema; checked as you type. Only a valid one is used.")
        self.schema_status = QLabel()
        self.schema_status.setObjectName("schemaError")
        self.schema_status.setWordWrap(True)
        self._schema = ""  # the last valid schema: what replies follow while the editor holds a bad one

    def _lay_out(self) -> None:
        form = QFormLayout()
        for label, box in (("Preset", self.preset), ("Temperature", self.temperature), ("Top-p", self.top_p),
                           ("Top-k", self.top_k), ("Max tokens", self.max_tokens), ("Seed", self.seed),
                           ("Repetition penalty", self.repetition_penalty),
                           ("Presence penalty", self.presence_penalty),
                           ("Frequency penalty", self.frequency_penalty)):  # fmt: skip
            form.addRow(label, box)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(_section_title("System prompt"))
        layout.addWidget(self.system_prompt)
        layout.addWidget(_section_title("Sampling"))
        layout.addLayout(form)
        layout.addWidget(_section_title("Context"))
        overflow_form = QFormLayout()
        overflow_form.addRow("When full", self.overflow)
        layout.addLayout(overflow_form)
        layout.addWidget(_section_title("Output"))
        output_form = QFormLayout()
        output_form.addRow("Replies", self.output)
        layout.addLayout(output_form)
        layout.addWidget(self.schema_editor)
        layout.addWidget(self.schema_status)
        layout.addWidget(self.show_tokens)
        layout.addStretch(1)

    def _connect(self) -> None:
        # typing a system prompt should not write the store on every key press
        self._prompt_timer = QTimer(self, singleShot=True, interval=400)
        self._prompt_timer.timeout.connect(self._emit)
        self.system_prompt.textChanged.connect(self._prompt_timer.start)
        self.preset.currentTextChanged.connect(self._apply_preset)
        for box in (self.temperature, self.top_p, self.repetition_penalty, self.presence_penalty,
                    self.frequency_penalty):  # fmt: skip
            box.valueChanged.connect(self._on_value)
        for box in (self.top_k, self.max_tokens, self.seed):
            box.valueChanged.connect(self._on_value)
        self.overflow.currentIndexChanged.connect(self._on_value)
        self.output.currentIndexChanged.connect(self._on_output)
        self.schema_editor.textChanged.connect(self._on_schema_typed)
        self.show_tokens.toggled.connect(self._on_value)

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
            presence_penalty=round(self.presence_penalty.value(), 2),
            frequency_penalty=round(self.frequency_penalty.value(), 2),
            overflow=OverflowPolicy(self.overflow.currentData() or OverflowPolicy.STOP),
            output=OutputKind(self.output.currentData() or OutputKind.TEXT),
            json_schema=self._schema,
            show_tokens=self.show_tokens.isChecked(),
        )

    def set_settings(self, settings: ChatSettings) -> None:
        widgets = (self.preset, self.system_prompt, self.temperature, self.top_p, self.top_k, self.max_tokens)
        others = (self.seed, self.repetition_penalty, self.overflow, self.output, self.schema_editor, self.show_tokens)
        penalties = (self.presence_penalty, self.frequency_penalty)
        blockers = [QSignalBlocker(w) for w in (*widgets, *others, *penalties)]
        if self.system_prompt.toPlainText() != settings.system_prompt:
            self.system_prompt.setPlainText(settings.system_prompt)
        values = (
            (self.temperature, settings.temperature),
            (self.top_p, settings.top_p),
            (self.top_k, settings.top_k),
            (self.max_tokens, settings.max_tokens),
            (self.seed, -1 if settings.seed is None else settings.seed),
            (self.repetition_penalty, settings.repetition_penalty),
            (self.presence_penalty, settings.presence_penalty),
            (self.frequency_penalty, settings.frequency_penalty),
        )
        for box, value in values:
            # setting a box to the value it holds would still rewrite its text ("0" -> "0.00") while the user types
            # in it, and the next key ("." of "0.3") would land after the rewritten text and be refused
            if round(box.value(), 4) != round(value, 4):
                box.setValue(value)
        self.overflow.setCurrentIndex(max(0, self.overflow.findData(settings.overflow.value)))
        self.output.setCurrentIndex(max(0, self.output.findData(settings.output.value)))
        if settings.json_schema != self._schema:
            # another chat's or a stored schema; its own echo (the same schema) leaves a half-typed edit alone
            self._schema = settings.json_schema
            self.schema_editor.setPlainText(settings.json_schema)
        self.show_tokens.setChecked(settings.show_tokens)
        self.preset.setCurrentText(settings.preset_name() or CUSTOM)
        del blockers
        self._show_schema_state()

    def _apply_preset(self, name: str) -> None:
        if name in PRESETS:
            self.set_settings(self.settings().with_preset(name))
            self._emit()

    def _on_value(self, *_args) -> None:
        with QSignalBlocker(self.preset):
            self.preset.setCurrentText(self.settings().preset_name() or CUSTOM)
        self._emit()

    # ---- output -------------------------------------------------------------------------------
    @property
    def schema_error(self) -> str | None:
        """What is wrong with the schema in the editor (shown under it), or None."""
        return schema_problem(self.schema_editor.toPlainText())

    def _on_output(self, *_args) -> None:
        self._show_schema_state()
        self._emit()

    def _on_schema_typed(self) -> None:
        text = self.schema_editor.toPlainText()
        if schema_problem(text) is None and text != self._schema:
            self._schema = text
            self._prompt_timer.start()  # applied after a typing pause, as the system prompt is
        self._show_schema_state()

    def _show_schema_state(self) -> None:
        wanted = self.output.currentData() == OutputKind.SCHEMA.value
        self.schema_editor.setVisible(wanted)
        self.schema_status.setVisible(wanted)
        if not wanted:
            return
        problem = self.schema_error
        if problem is None:
            text, name = "Valid schema: replies follow it.", "schemaOk"
        elif self._schema:
            text, name = f"{problem}. Replies follow the last valid schema.", "schemaError"
        else:
            text, name = f"{problem}. Replies are free text until the schema is valid.", "schemaError"
        self.schema_status.setText(text)
        if self.schema_status.objectName() != name:
            self.schema_status.setObjectName(name)
            self.schema_status.style().unpolish(self.schema_status)
            self.schema_status.style().polish(self.schema_status)

    def _emit(self) -> None:
        self._prompt_timer.stop()
        self.settings_changed.emit(self.settings())
