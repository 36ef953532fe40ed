"""The window and issue 5: chats on a remote endpoint (the studio's own server as the remote), the add-endpoint
dialog, keys only in the keyring, stalls shown in the tab, and the API server toggle sharing the engine."""

from __future__ import annotations

import logging
import threading
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from app.hosting.backends import LOCAL
from app.remote.backends import parse_backend_id, remote_backend_id
from tests.app.conftest import settings, wait_idle
from tests.serving import ServedStudio
from tests.stub_server import stub_server

REMOTE = remote_backend_id("studio", "tiny")


@pytest.fixture
def window_with_remote(make_window, tiny_server: ServedStudio, server_api_key: str, ignore_eos):
    window = make_window()
    assert window.remote.add_endpoint("studio", tiny_server.url, server_api_key, ["tiny"])
    return window


def test_backend_ids_round_trip() -> None:
    backend_id = remote_backend_id("gpu: cluster/2", "meta-llama/Llama-3.1-8B")
    assert parse_backend_id(backend_id) == ("gpu: cluster/2", "meta-llama/Llama-3.1-8B")
    assert parse_backend_id(LOCAL) is None and parse_backend_id("remote:[broken") is None


def test_a_chat_streams_from_the_remote_beside_a_local_one(window_with_remote, qtbot, caplog) -> None:
    window = window_with_remote
    caplog.set_level(logging.DEBUG)
    remote_chat = window.tabs.current
    assert remote_chat.backend_id == REMOTE  # adding an endpoint moves the current chat to its first model
    assert window.remote.picker.current() == REMOTE
    remote_chat.set_settings(settings(max_tokens=16))
    local_chat = window.tabs.new_chat(settings(max_tokens=16))
    assert local_chat.backend_id == LOCAL
    remote_chat.send("hello from the remote tab")
    local_chat.send("hello from the local tab")
    wait_idle(qtbot, remote_chat, local_chat)
    for chat in (remote_chat, local_chat):
        reply = chat.messages[-1]
        assert reply.error is None and reply.finish_reason == "length" and reply.content
        assert reply.stats.output_tokens == 16 and reply.stats.ttft_s > 0
    # the chat remembers its backend
    assert window.store.load_chat(remote_chat.chat_id).backend == REMOTE


def test_stop_on_a_remote_chat_frees_the_remote_pages(window_with_remote, qtbot, tiny_server) -> None:
    window = window_with_remote
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=900))  # the served context is 1,024 tokens
    chat.send("a long story please")
    qtbot.waitUntil(lambda: len(chat.messages[-1].content) > 3, timeout=60_000)
    chat.stop()
    wait_idle(qtbot, chat)
    assert chat.messages[-1].finish_reason == "abort" and chat.messages[-1].content
    tiny_server.wait_for_metric("vllm:num_requests_running", lambda v: v == 0)


def test_the_status_bar_shows_what_the_remote_reports(window_with_remote, qtbot) -> None:
    window = window_with_remote
    label = window.remote.remote_label
    qtbot.waitUntil(lambda: "KV" in label.text(), timeout=30_000)
    assert label.text().startswith("tiny @ studio") and "running" in label.text()
    client = window.remote.current_client()  # what a dashboard reads for a remote chat
    assert client.latest_metrics.available and client.metrics.snapshot().steps == []
    switched = []
    window.remote.remote_client_changed.connect(switched.append)
    window.remote.choose_backend(LOCAL)
    assert not label.isVisible() and switched == [None] and window.remote.current_client() is None


def test_keys_live_in_the_keyring_only(window_with_remote, memory_keyring, server_api_key, studio_home, caplog):
    window = window_with_remote
    window.settings.sync()
    assert memory_keyring.store[("inference-studio", "endpoint:studio")] == server_api_key
    for path in studio_home.rglob("*"):
        if path.is_file():
            assert server_api_key.encode() not in path.read_bytes(), path
    assert server_api_key not in caplog.text
    window.remote.remove_endpoint("studio")
    assert ("inference-studio", "endpoint:studio") not in memory_keyring.store
    assert window.tabs.current.backend_id == LOCAL and window.remote.book.all() == []


def test_a_stalled_endpoint_ends_the_reply_with_a_clear_message_in_the_tab(make_window, qtbot) -> None:
    release = threading.Event()

    def stall(request) -> None:
        if request.command == "GET":
            release.wait(10)
            return
        request.send_response(200)
        request.send_header("Content-Type", "text/event-stream")
        request.end_headers()
        request.wfile.flush()
        release.wait(10)

    window = make_window()
    window.remote.backends.read_timeout_s = 0.5
    with stub_server(stall) as url:
        window.remote.add_endpoint("stuck", url, "", ["m"])
        chat = window.tabs.current
        chat.send("hello?")
        wait_idle(qtbot, chat, timeout=20_000)
        release.set()
    reply = chat.messages[-1]
    assert reply.finish_reason == "error" and "no answer" in reply.error and "stalled" in reply.error
    other = window.tabs.new_chat(settings(max_tokens=2))  # the window and the local engine carry on
    other.send("still there?")
    wait_idle(qtbot, other)
    assert other.messages[-1].error is None


def test_the_add_endpoint_dialog_lists_models(qtbot, tiny_server: ServedStudio, server_api_key: str) -> None:
    from app.remote.features import list_endpoint_models
    from widgets.dialogs.endpoint import EndpointDialog

    dialog = EndpointDialog(list_endpoint_models, {"taken"})
    qtbot.addWidget(dialog)
    save = dialog.buttons.button(dialog.buttons.StandardButton.Save)
    assert not save.isEnabled()
    dialog.base_url.setText(tiny_server.url)
    dialog.api_key.setText("sk-wrong")
    dialog.fetch_models()
    qtbot.waitUntil(lambda: "Could not list" in dialog.state.text(), timeout=30_000)
    assert "401" in dialog.state.text()
    dialog.api_key.setText(server_api_key)
    dialog.fetch_models()
    qtbot.waitUntil(lambda: dialog.models.count() == 1, timeout=30_000)
    assert dialog.ticked() == ("tiny",) and dialog.name.text() == "127.0.0.1" and save.isEnabled()
    dialog.name.setText("taken")
    assert not save.isEnabled()
    dialog.name.setText("mine")
    values = dialog.values()
    assert (values.name, values.api_key, values.models) == ("mine", server_api_key, ("tiny",))


def test_the_api_server_toggle_shares_the_engine_with_the_chats(make_window, qtbot, ignore_eos) -> None:
    window = make_window()
    features = window.remote
    features.server_settings.port = 0  # any free port, for the test
    features.serve_action.setChecked(True)
    qtbot.waitUntil(lambda: features.server_label.text().startswith("API :"), timeout=30_000)
    url = features.server.url
    assert features.server_label.text() == f"API :{urlsplit(url).port} (no key)"
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=24))
    chat.send("hello from the window")
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello from the API"}], max_tokens=8,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert reply.usage.completion_tokens == 8
    wait_idle(qtbot, chat)
    assert chat.messages[-1].error is None
    features.serve_action.setChecked(False)
    qtbot.waitUntil(lambda: not features.server_label.isVisible(), timeout=10_000)

    def port_closed() -> bool:
        try:
            httpx.get(url.removesuffix("/v1") + "/health", timeout=2)
        except httpx.ConnectError:
            return True
        return False

    qtbot.waitUntil(port_closed, timeout=15_000)
    assert window.bridge.thread is not None and window.bridge.thread.alive


def test_a_taken_port_is_reported_and_the_toggle_goes_off(make_window, qtbot) -> None:
    import socket

    window = make_window()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        window.remote.server_settings.port = taken.getsockname()[1]
        window.remote.serve_action.setChecked(True)
        assert not window.remote.serve_action.isChecked()
        assert "could not start" in window.notice.text and "cannot listen" in window.notice.text


def test_the_dashboard_follows_a_remote_chat_and_plots_what_the_server_reports(window_with_remote, qtbot) -> None:
    window = window_with_remote
    dashboard = window.add_dashboard()
    window.actions.dashboard.trigger()
    client = window.remote.current_client()
    panel = dashboard.remote
    # the charts read the client-side timings of the remote chat; the remote panel what the server says
    assert client is not None and dashboard.source == client.metrics.snapshot and not panel.isHidden()
    qtbot.waitUntil(lambda: panel.latest is not None and panel.latest.available, timeout=30_000)
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=16))
    chat.send("hello from the remote tab")
    wait_idle(qtbot, chat)
    qtbot.waitUntil(lambda: dashboard.history.tokens.size > 0, timeout=30_000)  # a record per text chunk
    qtbot.waitUntil(lambda: len(panel.samples) >= 2, timeout=30_000)
    dashboard.redraw()
    assert panel.data["t"].size >= 2 and (panel.data["kv_percent"] >= 0).all()
    # back on this computer's engine: the engine's own metrics again, no remote panel
    window.remote.choose_backend(LOCAL)
    assert panel.isHidden() and dashboard.source == window.bridge.thread.metrics.snapshot
