"""The web pages allowed to call the window's API server, set in its dialog: a malformed origin keeps the dialog open
with the reason, '*' is warned about, and a saved page gets CORS answers from the restarted server at once."""

from __future__ import annotations

import httpx

from tests.app.hosting.test_server_keys import free_port
from widgets.dialogs.server import ServerDialog, ServerValues

PAGE = "http://localhost:5173"


class NoKeys:
    def stored(self) -> bool:
        return False

    def save(self, key: str) -> None:
        raise AssertionError("no key is typed here")


def allowed_origin(url: str, origin: str) -> str | None:
    headers = {"Origin": origin, "Access-Control-Request-Method": "POST"}
    return httpx.options(f"{url}/chat/completions", headers=headers, timeout=30).headers.get(
        "access-control-allow-origin"
    )


def test_the_dialog_checks_origins_and_warns_about_any(qtbot) -> None:
    from engine.serve.cross_site import check_origins

    dialog = ServerDialog(ServerValues(8000, False), NoKeys(), check_origins=check_origins)
    qtbot.addWidget(dialog)
    dialog.origins.setText("localhost:5173/app")
    dialog.accept()
    assert dialog.result() != ServerDialog.DialogCode.Accepted
    assert "is not an origin" in dialog.origins_state.text()
    dialog.origins.setText("*")
    assert "every web page" in dialog.origins_state.text() and "without a key" in dialog.origins_state.text()
    dialog.origins.setText(f"{PAGE}, https://app.example")
    dialog.accept()
    assert dialog.result() == ServerDialog.DialogCode.Accepted
    assert dialog.values().allowed_origins == (PAGE, "https://app.example")


def test_a_page_saved_in_the_dialog_is_answered_by_the_running_server(make_window, qtbot, monkeypatch) -> None:
    window = make_window()
    features = window.remote
    features.server_settings.port = free_port()
    features.serve_action.setChecked(True)
    qtbot.waitUntil(lambda: bool(features.server.url), timeout=30_000)
    url = features.server.url
    assert allowed_origin(url, PAGE) is None  # closed by default

    def allow_the_page(dialog: ServerDialog) -> int:
        dialog.origins.setText(PAGE)
        dialog.accept()
        return ServerDialog.DialogCode.Accepted

    monkeypatch.setattr(ServerDialog, "exec", allow_the_page)
    first_server = features.server.server
    features.server_settings_dialog()
    qtbot.waitUntil(lambda: features.server.server not in (None, first_server) and bool(features.server.url),
                    timeout=30_000)  # fmt: skip
    assert features.server_settings.allowed_origins == [PAGE]
    assert allowed_origin(features.server.url, PAGE) == PAGE
    assert allowed_origin(features.server.url, "https://evil.example") is None
