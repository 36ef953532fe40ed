"""The window's API server and its key, with real HTTP requests: a key changed in the Server dialog replaces the old
one at once; a key the keyring cannot give refuses to start the server instead of serving without one."""

from __future__ import annotations

import socket

import httpx
import keyring
import keyring.backend
import keyring.errors

from app.hosting.server_settings import KEY_NAME
from widgets.dialogs.server import ServerDialog


class LockedKeyring(keyring.backend.KeyringBackend):
    """A keyring that is locked (or whose daemon is gone): every read and write fails."""

    priority = 1  # type: ignore[assignment]

    def get_password(self, service: str, username: str) -> str | None:
        raise keyring.errors.KeyringLocked("the keyring is locked")

    def set_password(self, service: str, username: str, password: str) -> None:
        raise keyring.errors.KeyringLocked("the keyring is locked")

    def delete_password(self, service: str, username: str) -> None:
        raise keyring.errors.KeyringLocked("the keyring is locked")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def status_with(url: str, key: str) -> int:
    return httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code


def test_changing_only_the_key_restarts_the_server_with_the_new_key(
    make_window, qtbot, memory_keyring, monkeypatch
) -> None:
    window = make_window()
    features = window.remote
    memory_keyring.set_password("inference-studio", KEY_NAME, "sk-old-key")
    features.server_settings.port = free_port()
    features.server_settings.require_key = True
    features.serve_action.setChecked(True)
    assert features.serve_action.isChecked(), window.notice.text
    qtbot.waitUntil(lambda: features.server_label.text().startswith("API :"), timeout=30_000)
    url = features.server.url
    assert features.server_label.text().endswith("(key required)")
    assert (status_with(url, "sk-old-key"), status_with(url, "sk-new-key")) == (200, 401)

    def type_a_new_key_and_save(dialog: ServerDialog) -> int:
        dialog.key.setText("sk-new-key")  # port and "require a key" unchanged
        dialog.accept()
        return ServerDialog.DialogCode.Accepted

    monkeypatch.setattr(ServerDialog, "exec", type_a_new_key_and_save)
    first_server = features.server.server
    features.server_settings_dialog()
    qtbot.waitUntil(lambda: features.server.server not in (None, first_server) and bool(features.server.url),
                    timeout=30_000)  # fmt: skip
    assert features.server.url == url  # the same port
    assert (status_with(url, "sk-old-key"), status_with(url, "sk-new-key")) == (401, 200)
    assert memory_keyring.get_password("inference-studio", KEY_NAME) == "sk-new-key"


def test_a_key_the_keyring_cannot_give_refuses_to_start_the_server(make_window, qtbot) -> None:
    window = make_window()
    features = window.remote
    port = free_port()
    features.server_settings.port = port
    features.server_settings.require_key = True
    keyring.set_keyring(LockedKeyring())
    features.serve_action.setChecked(True)
    assert not features.serve_action.isChecked() and features.server.server is None
    assert "could not start" in window.notice.text and "keyring" in window.notice.text
    assert "KeyringLocked" in window.notice.text
    assert not features.server_label.isVisible()  # nothing claims a key is required of a server that is not there
    with socket.socket() as probe:  # and nothing listens without a key
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_a_required_key_that_was_never_stored_refuses_too(make_window, qtbot) -> None:
    window = make_window()
    features = window.remote
    features.server_settings.port = free_port()
    features.server_settings.require_key = True
    features.serve_action.setChecked(True)
    assert not features.serve_action.isChecked()
    assert "none is stored" in window.notice.text
