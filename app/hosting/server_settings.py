"""The window's API server preferences (port, whether a key is required, the web pages allowed to call it) in
QSettings; the key in the keyring."""

from __future__ import annotations

from PySide6.QtCore import QSettings

from engine.credentials import get_secret, read_secret, set_secret
from engine.errors import KeyringError

DEFAULT_PORT = 8000


def origins_in(text: str) -> list[str]:
    """Origins typed in a field, separated by spaces or commas."""
    return [part for part in text.replace(",", " ").split() if part]


# The same keyring entry `inference-studio serve --api-key-from-keyring local-server-api-key` reads.
KEY_NAME = "local-server-api-key"


class ServerSettings:
    def __init__(self, qsettings: QSettings) -> None:
        self.qsettings = qsettings

    @property
    def port(self) -> int:
        try:
            port = int(self.qsettings.value("server/port", DEFAULT_PORT))
        except (TypeError, ValueError):
            return DEFAULT_PORT
        return port if 0 <= port <= 65535 else DEFAULT_PORT  # 0: any free port (tests)

    @port.setter
    def port(self, value: int) -> None:
        self.qsettings.setValue("server/port", int(value))

    @property
    def require_key(self) -> bool:
        return str(self.qsettings.value("server/require_key", "false")) == "true"

    @require_key.setter
    def require_key(self, value: bool) -> None:
        self.qsettings.setValue("server/require_key", "true" if value else "false")

    @property
    def allowed_origins(self) -> list[str]:
        """Web page origins that may call the server from a browser (CORS); none by default."""
        value = self.qsettings.value("server/allowed_origins", "")
        text = " ".join(value) if isinstance(value, list) else str(value or "")  # QSettings reads "a, b" as a list
        return origins_in(text)

    @allowed_origins.setter
    def allowed_origins(self, origins: list[str]) -> None:
        self.qsettings.setValue("server/allowed_origins", " ".join(origins))

    def api_key(self) -> str | None:
        """The key to require, or None when none is required. When one is required but cannot be read (a locked
        keyring) or is not stored, this raises KeyringError: the server must not start without the key it
        announces."""
        if not self.require_key:
            return None
        key = read_secret(KEY_NAME)
        if not key:
            raise KeyringError(
                "an API key is required but none is stored; enter one in Server ▸ API server settings… "
                "or untick “Require an API key”"
            )
        return key


class ServerKeys:
    """The server dialog's KeyAccess, backed by the OS keyring."""

    def stored(self) -> bool:
        return bool(get_secret(KEY_NAME))

    def save(self, key: str) -> None:
        set_secret(KEY_NAME, key)
