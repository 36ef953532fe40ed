"""StudioSettings: preferences in QSettings (an INI file in the user config folder); never secrets."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import platformdirs
from PySide6.QtCore import QByteArray, QSettings

from app.setting_values import BAD_VALUE, flag, integer, one_of, read_setting
from engine.core.config import EngineConfig
from engine.domain.model_choice import DEFAULT_KV_MIB, ModelChoice
from engine.errors import StudioError
from engine.paths import APP_NAME, HOME_ENV
from widgets.chat.message_input import SEND_ENTER, SEND_KEYS

log = logging.getLogger(__name__)

THEMES = ("system", "light", "dark")
RECENT_LIMIT = 8


def settings_path() -> Path:
    """INFERENCE_STUDIO_HOME/config/settings.ini when set (tests, portable installs), else the OS config folder."""
    home = os.environ.get(HOME_ENV)
    folder = Path(home).expanduser() / "config" if home else Path(platformdirs.user_config_dir(APP_NAME))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only home: the defaults, and nothing remembered
        log.warning("the settings folder %s cannot be created (%s); settings are not kept", folder, exc)
    return folder / "settings.ini"


def _model_choice(raw: object) -> ModelChoice:
    """A model choice as the settings store it (JSON), each field of its type, or ValueError saying which is not."""
    data = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    for name in ("spec", "dtype", "quantization", "device"):
        if name in data and not isinstance(data[name], str):
            raise ValueError(f"{name!r} is not text")
    if "kv_memory_mib" in data:
        integer(0, 1 << 30)(data["kv_memory_mib"])  # 0: automatic
    return ModelChoice.from_dict(data)


def _recent_models(raw: object) -> list[ModelChoice]:
    items = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(items, list):
        raise ValueError("not a JSON list")
    choices = []
    for item in items:
        try:
            choices.append(_model_choice(item))
        except BAD_VALUE as exc:
            log.warning("settings: a recent model entry %r is not valid (%s); left out", item, exc)
    return choices


class StudioSettings:
    """Every value read is checked (app/setting_values.py): one a hand-edited or damaged settings.ini holds that does
    not fit gives way to its default, with a log line, instead of stopping the studio."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or settings_path()
        self.qsettings = QSettings(str(self.path), QSettings.Format.IniFormat)

    def sync(self) -> None:
        self.qsettings.sync()

    def _get(self, key: str, default, parse):
        return read_setting(self.qsettings, key, default, parse)

    # ---- appearance and input ---------------------------------------------------------------
    @property
    def theme(self) -> str:
        return self._get("ui/theme", "system", one_of(*THEMES))

    @theme.setter
    def theme(self, value: str) -> None:
        self.qsettings.setValue("ui/theme", value if value in THEMES else "system")

    @property
    def font_size(self) -> int:
        return self._get("ui/font_size", 10, integer(7, 32))

    @font_size.setter
    def font_size(self, value: int) -> None:
        self.qsettings.setValue("ui/font_size", int(value))

    @property
    def send_key(self) -> str:
        return self._get("ui/send_key", SEND_ENTER, one_of(*SEND_KEYS))

    @send_key.setter
    def send_key(self, value: str) -> None:
        self.qsettings.setValue("ui/send_key", value)

    @property
    def settings_panel_visible(self) -> bool:
        return self._get("ui/settings_panel", True, flag)

    @settings_panel_visible.setter
    def settings_panel_visible(self, value: bool) -> None:
        self.qsettings.setValue("ui/settings_panel", "true" if value else "false")

    @property
    def sidebar_width(self) -> int:
        """Width of the chats' settings sidebar as the user dragged it (0: the default)."""
        return self._get("window/sidebar_width", 0, integer(0, 100_000))

    @sidebar_width.setter
    def sidebar_width(self, value: int) -> None:
        self.qsettings.setValue("window/sidebar_width", int(value))

    # ---- models -----------------------------------------------------------------------------
    @property
    def kv_memory_mib(self) -> int:
        value = self._get("engine/kv_memory_mib", DEFAULT_KV_MIB, integer(0, 1 << 30))
        return 0 if value <= 0 else max(16, value)  # 0: automatic

    @kv_memory_mib.setter
    def kv_memory_mib(self, value: int) -> None:
        self.qsettings.setValue("engine/kv_memory_mib", int(value))

    @property
    def engine_config(self) -> EngineConfig:
        """The engine settings every model loads with (its KV budget comes with the model choice)."""
        defaults = EngineConfig()
        step_tokens = self._get("engine/max_step_tokens", 0, integer(0, 1 << 20))
        config = EngineConfig(
            page_size=self._get("engine/page_size", defaults.page_size, integer(1, 4096)),
            max_running=self._get("engine/max_running", defaults.max_running, integer(1, 1 << 16)),
            max_step_tokens=step_tokens if step_tokens > 0 else None,
            prefix_caching=self._get("engine/prefix_caching", True, flag),
            compiled_step=self._get("engine/compiled_step", True, flag),
        )
        try:
            config.validate()
        except StudioError as exc:  # a hand-edited settings file: the defaults rather than a studio that won't load
            log.warning("settings: the engine settings are not valid together (%s); using the defaults", exc)
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
        return self._get("models/default", ModelChoice(), _model_choice)

    @default_model.setter
    def default_model(self, choice: ModelChoice) -> None:
        self.qsettings.setValue("models/default", json.dumps(choice.to_dict()))

    @property
    def recent_models(self) -> list[ModelChoice]:
        return self._get("models/recent", [], _recent_models)

    def add_recent_model(self, choice: ModelChoice) -> None:
        recent = [c for c in self.recent_models if c != choice]
        recent.insert(0, choice)
        self.qsettings.setValue("models/recent", json.dumps([c.to_dict() for c in recent[:RECENT_LIMIT]]))

    @property
    def current_chat(self) -> int | None:
        """The chat whose tab was in front when the window closed."""
        value = self._get("ui/current_chat", -1, integer(-1, 1 << 62))
        return value if value >= 0 else None

    @current_chat.setter
    def current_chat(self, chat_id: int | None) -> None:
        self.qsettings.setValue("ui/current_chat", -1 if chat_id is None else chat_id)

    # ---- window -----------------------------------------------------------------------------
    def window_state(self) -> tuple[QByteArray | None, QByteArray | None]:
        return self._get("window/geometry", None, _byte_array), self._get("window/state", None, _byte_array)

    def save_window_state(self, geometry: QByteArray, state: QByteArray) -> None:
        self.qsettings.setValue("window/geometry", geometry)
        self.qsettings.setValue("window/state", state)


def _byte_array(raw: object) -> QByteArray:
    if not isinstance(raw, QByteArray):
        raise TypeError(f"not saved window geometry: {type(raw).__name__}")
    return raw
