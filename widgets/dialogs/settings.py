"""SettingsDialog: theme, font size, send key, default model and KV budget, engine settings, and the hub token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.core.config import EngineConfig
from engine.domain.model_choice import ModelChoice
from engine.errors import StudioError
from widgets.background import BackgroundCall
from widgets.chat.message_input import SEND_KEYS

THEME_LABELS = {"system": "Follow the system", "light": "Light", "dark": "Dark"}


class TokenAccess(Protocol):
    """The hub token lives in the OS keyring; the dialog never holds a stored token, only what the user types."""

    def stored(self) -> bool: ...

    def save(self, token: str) -> None: ...

    def remove(self) -> None: ...

    def test(self, token: str | None) -> str: ...  # slow (network): called off the UI thread


@dataclass(frozen=True)
class SettingsValues:
    theme: str
    font_size: int
    send_key: str
    kv_memory_mib: int
    default_model: ModelChoice
    engine: EngineConfig = field(default_factory=EngineConfig)


class SettingsDialog(QDialog):
    def __init__(
        self,
        values: SettingsValues,
        tokens: TokenAccess,
        current_model: ModelChoice | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setObjectName("settingsDialog")
        self.tokens = tokens
        self._default_model = values.default_model
        self._current_model = current_model
        self._tester = BackgroundCall(self)
        self._tester.succeeded.connect(lambda text: self._token_result(str(text), ok=True))
        self._tester.failed.connect(lambda text: self._token_result(text, ok=False))

        groups = (self._appearance(values), self._model_at_start(values), self._engine(values.engine), self._hub())
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        for group in groups:
            layout.addWidget(group)
        layout.addWidget(self.buttons)
        self._show_token_state()
        self.resize(520, 0)

    def _appearance(self, values: SettingsValues) -> QGroupBox:
        appearance = QGroupBox("Appearance and input")
        form = QFormLayout(appearance)
        self.theme = QComboBox()
        for key, label in THEME_LABELS.items():
            self.theme.addItem(label, key)
        self.theme.setCurrentIndex(list(THEME_LABELS).index(values.theme))
        self.font_size = QSpinBox()
        self.font_size.setRange(7, 32)
        self.font_size.setSuffix(" pt")
        self.font_size.setValue(values.font_size)
        self.send_key = QComboBox()
        for key, label in SEND_KEYS.items():
            self.send_key.addItem(label, key)
        self.send_key.setCurrentIndex(max(0, list(SEND_KEYS).index(values.send_key)))
        form.addRow("Theme", self.theme)
        form.addRow("Font size", self.font_size)
        form.addRow("Sending", self.send_key)
        return appearance

    def _model_at_start(self, values: SettingsValues) -> QGroupBox:
        models = QGroupBox("Model at start")
        model_form = QFormLayout(models)
        self.default_model_label = QLabel(values.default_model.label)
        self.default_model_label.setWordWrap(True)
        use_current = QPushButton("Use the current model")
        use_current.setEnabled(self._current_model is not None)
        use_current.clicked.connect(lambda: self._set_default_model(self._current_model))
        use_embedded = QPushButton("Use the embedded model")
        use_embedded.clicked.connect(lambda: self._set_default_model(ModelChoice(kv_memory_mib=self.kv.value())))
        buttons = QHBoxLayout()
        buttons.addWidget(use_current)
        buttons.addWidget(use_embedded)
        buttons.addStretch(1)
        self.kv = QSpinBox()
        self.kv.setRange(0, 1024 * 1024)
        self.kv.setSpecialValueText("auto")  # 0: worked out from the model and the free memory
        self.kv.setSingleStep(128)
        self.kv.setSuffix(" MiB")
        self.kv.setValue(values.kv_memory_mib)
        self.kv.setToolTip(
            "KV-cache memory the model picker starts from; auto: 16,384 tokens of the model's KV, at most half the "
            "memory free beside the model"
        )
        model_form.addRow("Default model", self.default_model_label)
        model_form.addRow("", buttons)
        model_form.addRow("KV cache budget", self.kv)
        return models

    def _engine(self, config: EngineConfig) -> QGroupBox:
        engine = QGroupBox("Engine (applies when a model loads)")
        engine_form = QFormLayout(engine)
        self.page_size = QSpinBox()
        self.page_size.setRange(1, 256)
        self.page_size.setSuffix(" tokens")
        self.page_size.setValue(config.page_size)
        self.page_size.setToolTip("Tokens per KV-cache page: smaller pages waste less memory, larger ones cost less")
        self.max_running = QSpinBox()
        self.max_running.setRange(1, 1024)
        self.max_running.setValue(config.max_running)
        self.max_running.setToolTip("Most replies decoded together in one step")
        self.step_tokens = QSpinBox()
        self.step_tokens.setRange(0, 65536)
        self.step_tokens.setSingleStep(64)
        self.step_tokens.setSpecialValueText("auto (256 on a CPU, 2048 on a GPU)")
        self.step_tokens.setValue(config.max_step_tokens or 0)
        self.step_tokens.setToolTip("Tokens computed in one step; long prompts are prefilled in chunks of it")
        self.prefix_caching = QCheckBox("Share the KV pages of a common prefix (system prompt, history)")
        self.prefix_caching.setChecked(config.prefix_caching)
        self.compiled_step = QCheckBox("Run decode steps as one C++ call (compiled for this CPU on first use)")
        self.compiled_step.setChecked(config.compiled_step)
        self.compiled_step.setToolTip(
            "Needs a C++ compiler (g++ or clang); without one, or off, every step runs through the Python layers"
        )
        engine_form.addRow("KV page size", self.page_size)
        engine_form.addRow("Replies per step", self.max_running)
        engine_form.addRow("Step token budget", self.step_tokens)
        engine_form.addRow("Prefix caching", self.prefix_caching)
        engine_form.addRow("Compiled step", self.compiled_step)
        self._engine_defaults = config
        return engine

    def _hub(self) -> QGroupBox:
        hub = QGroupBox("Hugging Face hub token")
        hub_layout = QVBoxLayout(hub)
        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText("hf_… (kept in the system keyring, never in a file)")
        self.token_state = QLabel()
        self.token_state.setObjectName("hint")
        self.token_state.setWordWrap(True)
        # room for two lines up front: a dialog does not grow when a wrapped label gets longer
        self.token_state.setMinimumHeight(self.token_state.fontMetrics().lineSpacing() * 2 + 4)
        self.test_button = QPushButton("Test token")
        self.test_button.clicked.connect(self.test_token)
        self.remove_button = QPushButton("Remove stored token")
        self.remove_button.clicked.connect(self.remove_token)
        token_buttons = QHBoxLayout()
        token_buttons.addWidget(self.test_button)
        token_buttons.addWidget(self.remove_button)
        token_buttons.addStretch(1)
        hub_layout.addWidget(self.token)
        hub_layout.addLayout(token_buttons)
        hub_layout.addWidget(self.token_state)
        return hub

    def values(self) -> SettingsValues:
        return SettingsValues(
            theme=self.theme.currentData(),
            font_size=self.font_size.value(),
            send_key=self.send_key.currentData(),
            kv_memory_mib=self.kv.value(),
            default_model=self._default_model,
            engine=EngineConfig(
                page_size=self.page_size.value(),
                max_running=self.max_running.value(),
                max_step_tokens=self.step_tokens.value() or None,
                prefix_caching=self.prefix_caching.isChecked(),
                optimize=self._engine_defaults.optimize,
                compiled_step=self.compiled_step.isChecked(),
            ),
        )

    def _set_default_model(self, choice: ModelChoice | None) -> None:
        if choice is not None:
            self._default_model = choice
            self.default_model_label.setText(choice.label)

    # ---- hub token --------------------------------------------------------------------------
    def _show_token_state(self, text: str | None = None) -> None:
        stored = self.tokens.stored()
        self.remove_button.setEnabled(stored)
        if text is None:
            text = "A token is stored in the system keyring." if stored else "No token stored."
        self.token_state.setText(text)

    def test_token(self) -> None:
        typed = self.token.text().strip() or None
        if typed is None and not self.tokens.stored():
            self._show_token_state("Enter a token to test.")
            return
        self.test_button.setEnabled(False)
        self.token_state.setText("Asking huggingface.co who this token belongs to…")
        self._tester.run(lambda: self.tokens.test(typed))

    def _token_result(self, text: str, ok: bool) -> None:
        self.test_button.setEnabled(True)
        self.token_state.setText(text if ok else f"Token not confirmed: {text}")

    def remove_token(self) -> None:
        self.tokens.remove()
        self.token.clear()
        self._show_token_state("The stored token was removed from the keyring.")

    def accept(self) -> None:
        typed = self.token.text().strip()
        if typed:
            try:
                self.tokens.save(typed)
            except StudioError as exc:  # a locked or missing keyring: say so here, keep the dialog open
                self.token_state.setText(str(exc))
                return
            self.token.clear()
        super().accept()
