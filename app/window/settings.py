"""StudioSettings: preferences in QSettings (an INI file in the user config folder); never secrets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import platformdirs
from PySide6.QtCore import QByteArray, QSettings

from engine.core.config import EngineConfig
from engine.errors import StudioError
from engine.paths import APP_NAME, HOME_ENV
from widgets.chat.message_input import SEND_ENTER, SEND_KEYS
from widgets.model.choice import DEFAULT_KV_MIB, ModelChoice

THEMES = ("system", "light", "dark")
RECENT_LIMIT = 8


def settings_path() -> Path:
    """INFERENCE_STUDIO_HOME/config/settings.ini when set (tests, portable installs), else the OS config folder."""
    home = os.environ.get(HOME_ENV)
    folder = Path(home).expanduser() / "config" if home else Path(platformdirs.user_config_dir(APP_NAME))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "settings.ini"


class StudioSettings:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or settings_path()
        self.qsettings = QSettings(str(self.path), QSettings.Format.IniFormat)

    def sync(self) -> None:
        self.qsettings.sync()

    def _get(self, key: str, default, kind=None):
        value = self.qsettings.value(key, default)
        if kind is None or value is None:
            return value
        try:
            return kind(value)
        except (TypeError, ValueError):
            return default

    # ---- appearance and input ---------------------------------------------------------------
    @property
    def theme(self) -> str:
        value = self._get("ui/theme", "system", str)
        return value if value in THEMES else "system"

    @theme.setter
    def theme(self, value: str) -> None:
        self.qsettings.setValue("ui/theme", value if value in THEMES else "system")

    @property
    def font_size(self) -> int:
        return max(7, min(32, self._get("ui/font_size", 10, int)))

    @font_size.setter
    def font_size(self, value: int) -> None:
        self.qsettings.setValue("ui/font_size", int(value))

    @property
    def send_key(self) -> str:
        value = self._get("ui/send_key", SEND_ENTER, str)
        return value if value in SEND_KEYS else SEND_ENTER

    @send_key.setter
    def send_key(self, value: str) -> None:
        self.qsettings.setValue("ui/send_key", value)

    @property
    def settings_panel_visible(self) -> bool:
        return self._get("ui/settings_panel", "true", str) == "true"

    @settings_panel_visible.setter
    def settings_panel_visible(self, value: bool) -> None:
        self.qsettings.setValue("ui/settings_panel", "true" if value else "false")

    @property
    def sidebar_width(self) -> int:
        """Width of the chats' settings sidebar as the user dragged it (0: the default)."""
        return max(0, self._get("window/sidebar_width", 0, int))

    @sidebar_width.setter
    def sidebar_width(self, value: int) -> None:
        self.qsettings.setValue("window/sidebar_width", int(value))

    # ---- models -----------------------------------------------------------------------------
    @property
    def kv_memory_mib(self) -> int:
        value = self._get("engine/kv_memory_mib", DEFAULT_KV_MIB, int)
        return 0 if value <= 0 else max(16, value)  # 0: automatic

    @kv_memory_mib.setter
    def kv_memory_mib(self, value: int) -> None:
        self.qsettings.setValue("engine/kv_memory_mib", int(value))

    @property
    def engine_config(self) -> EngineConfig:
        """The engine settings every model loads with (its KV budget comes with the model choice)."""
        defaults = EngineConfig()
        step_tokens = self._get("engine/max_step_tokens", 0, int)
        config = EngineConfig(
            page_size=self._get("engine/page_size", defaults.page_size, int),
            max_running=self._get("engine/max_running", defaults.max_running, int),
            max_step_tokens=step_tokens if step_tokens > 0 else None,
            prefix_caching=self._get("engine/prefix_caching", "true", str) == "true",
            compiled_step=self._get("engine/compiled_step", "true", str) == "true",
        )
        try:
            config.validate()
        except StudioError:  # a hand-edited settings file: the defaults rather than a studio that won't load
            return defaults
        return config

    @engine_config.setter
    def engine_config(self, config: EngineConfig) -> None:
        self.qsettings.setValue("engine/page_size", config.page_size)
        self.qsettings.setValue("engine/max_running", config.max_running)
        self.qsettings.setValue("engine/max_step_tokens", config.max_step_tokens or 0)
        self.qsettings.setValue("engine/prefix_caching", "true" if config.prefix_caching else "false")
        self.qsettings.setValue("engine/compiled_step", "true" if config.compiled_step else "false")

    @property
    def default_model(self) -> ModelChoice:
        """The model the studio loads at start (the embedded one unless the user chose another)."""
        raw = self._get("models/default", "", str)
        try:
            choice = ModelChoice.from_dict(json.loads(raw)) if raw else ModelChoice()
        except ValueError:
            choice = ModelChoice()
        return choice

    @default_model.setter
    def default_model(self, choice: ModelChoice) -> None:
        self.qsettings.setValue("models/default", json.dumps(choice.to_dict()))

    @property
    def recent_models(self) -> list[ModelChoice]:
        try:
            items = json.loads(self._get("models/recent", "[]", str))
        except ValueError:
            return []
        return [ModelChoice.from_dict(item) for item in items if isinstance(item, dict)]

    def add_recent_model(self, choice: ModelChoice) -> None:
        recent = [c for c in self.recent_models if c != choice]
        recent.insert(0, choice)
        self.qsettings.setValue("models/recent", json.dumps([c.to_dict() for c in recent[:RECENT_LIMIT]]))

    @property
    def current_chat(self) -> int | None:
        """The chat whose tab was in front when the window closed."""
        value = self._get("ui/current_chat", -1, int)
        return value if value >= 0 else None

    @current_chat.setter
    def current_chat(self, chat_id: int | None) -> None:
        self.qsettings.setValue("ui/current_chat", -1 if chat_id is None else chat_id)

    # ---- window -----------------------------------------------------------------------------
    def window_state(self) -> tuple[QByteArray | None, QByteArray | None]:
        return self.qsettings.value("window/geometry"), self.qsettings.value("window/state")

    def save_window_state(self, geometry: QByteArray, state: QByteArray) -> None:
        self.qsettings.setValue("window/geometry", geometry)
        self.qsettings.setValue("window/state", state)
