"""ModelSwitcher: loads the model the user picked and moves the chats onto it, asking about replies in flight."""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QMainWindow, QMessageBox

from app.chat.tabs import ChatTabs
from app.hosting.engine_bridge import EngineBridge
from app.hosting.picker_advisor import EngineAdvisor
from app.window.settings import StudioSettings
from engine.core.runtime import describe as describe_runtime
from engine.domain.model_choice import ModelChoice
from engine.load.loader import ModelInfo
from widgets.model.picker import ModelPickerDialog
from widgets.notice_bar import ERROR, INFO, NoticeBar
from widgets.status_bar import StudioStatusBar

FINISH = "finish"  # in-flight replies finish on the old model before the new one takes over
STOP = "stop"  # in-flight replies are stopped (their text kept) and the new model takes over at once


class ModelSwitcher(QObject):
    def __init__(
        self,
        window: QMainWindow,
        bridge: EngineBridge,
        tabs: ChatTabs,
        notice: NoticeBar,
        status: StudioStatusBar,
        settings: StudioSettings,
    ) -> None:
        super().__init__(window)
        self._window = window
        self._bridge = bridge
        self._tabs = tabs
        self._notice = notice
        self._status = status
        self._settings = settings
        self._policy = FINISH
        bridge.load_started.connect(lambda label: status.set_loading(f"Loading {label}…"))
        bridge.load_progress_changed.connect(lambda text: status.set_loading(text[:1].upper() + text[1:]))
        bridge.model_ready.connect(self._on_model_ready)
        bridge.model_changed.connect(self._on_model_changed)
        bridge.model_load_failed.connect(self._on_model_load_failed)
        tabs.busy_changed.connect(self._maybe_complete_swap)

    def load(self, choice: ModelChoice, policy: str = FINISH) -> bool:
        """Load in the background; on success open chats move to it (after their replies finish, or stopping
        them, per policy); on failure the current model stays. False if a load is already under way."""
        if not self._bridge.load(choice):
            self._notice.show_message("A model is already loading; wait for it to finish.", INFO)
            return False
        self._policy = policy
        return True

    def open_picker(self) -> None:
        current = self._bridge.choice or self._settings.default_model
        dialog = ModelPickerDialog(EngineAdvisor(), current, self._settings.recent_models, self._window)
        if dialog.exec() != ModelPickerDialog.DialogCode.Accepted:
            return
        choice = dialog.choice()
        if dialog.make_default.isChecked():
            self._settings.default_model = choice
        policy = FINISH
        if self._tabs.streaming_count():
            policy = self._ask_policy()
            if policy is None:
                return
        self.load(choice, policy)

    def _ask_policy(self) -> str | None:
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Switch model",
            "Replies are still being written.",
            QMessageBox.StandardButton.NoButton,
            self._window,
        )
        box.setInformativeText("Let them finish on the current model, or stop them now (their text is kept)?")
        finish = box.addButton("Let them finish", QMessageBox.ButtonRole.AcceptRole)
        stop = box.addButton("Stop them", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        return {id(finish): FINISH, id(stop): STOP}.get(id(box.clickedButton()))

    # ---- the bridge's news ------------------------------------------------------------------
    def _on_model_ready(self) -> None:
        if self._policy == STOP:
            self._tabs.stop_all()
        count = self._tabs.streaming_count()
        if count:
            replies = "reply being written finishes" if count == 1 else f"{count} replies being written finish"
            self._notice.show_message(f"The new model is loaded; it takes over when the {replies}.")
        self._maybe_complete_swap()

    def _maybe_complete_swap(self) -> None:
        if self._bridge.swap_pending and self._tabs.streaming_count() == 0:
            self._bridge.complete_swap()

    def _on_model_changed(self, info: ModelInfo) -> None:
        self._status.set_model(info.name, info.device, info.dtype, info.quantization)
        self._status.model.setToolTip(info.description)
        thread = self._bridge.thread
        if thread is not None:
            record = thread.engine.runtime_record()  # plain values, fixed once the engine is built
            summary = self._status.precision.text()
            layers = [f for f in record["layer_formats"] if f != info.dtype]
            if layers:
                summary += f" · layers {', '.join(layers)}"
            if str(record.get("compiled_step", "")).startswith("on"):
                summary += " · compiled step"
            self._status.set_runtime(summary, describe_runtime(record))
        self._window.setWindowTitle(f"Inference Studio — {info.name}")
        if self._notice.text.startswith("The new model"):
            self._notice.dismiss()
        if self._bridge.choice is not None:
            self._settings.add_recent_model(self._bridge.choice)
        for controller in self._tabs.controllers:
            controller.panel.notice.dismiss()

    def _on_model_load_failed(self, message: str) -> None:
        info = self._bridge.info
        if info is not None:
            self._status.set_model(info.name, info.device, info.dtype, info.quantization)
            text = f"Could not load the model: {message}. Still using {info.name}."
        else:
            self._status.set_loading(None)
            self._status.model.setText("no model loaded")
            text = f"Could not load the model: {message}"
            for controller in self._tabs.controllers:
                if controller.busy:
                    controller.panel.show_error(
                        f"No model could be loaded ({message}). Your message waits: choose a model "
                        "(Ctrl+Shift+M), or stop it (Esc)."
                    )
        self._notice.show_message(text, ERROR, ("Choose a model…", self.open_picker))
