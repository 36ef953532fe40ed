"""Endpoints typed without a scheme: http:// for this machine and private networks, https:// for the rest; an
explicit http:// to a public host warns that the key would travel in clear text (in the log and the dialog)."""

from __future__ import annotations

import logging

import pytest

from engine.remote.client import RemoteClient
from engine.remote.urls import cleartext_warning, normalize_base_url


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("localhost:11434", "http://localhost:11434/v1"),  # a local Ollama keeps working
        ("127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
        ("[::1]:8000", "http://[::1]:8000/v1"),
        ("192.168.1.20:8000", "http://192.168.1.20:8000/v1"),
        ("10.0.0.5:8000/v1", "http://10.0.0.5:8000/v1"),
        ("172.16.3.4", "http://172.16.3.4/v1"),
        ("100.101.102.103:8000", "http://100.101.102.103:8000/v1"),  # Tailscale / CGNAT
        ("fd12:3456::1", "http://fd12:3456::1/v1"),
        ("gpu-box:8000", "http://gpu-box:8000/v1"),  # a single-label name resolves only on the local network
        ("gpu-node.local:8000", "http://gpu-node.local:8000/v1"),
        ("studio.internal", "http://studio.internal/v1"),
        ("api.example.com", "https://api.example.com/v1"),
        ("api.openai.com/v1", "https://api.openai.com/v1"),
        ("8.8.8.8:8000", "https://8.8.8.8:8000/v1"),
        ("localhost.example.com:8000", "https://localhost.example.com:8000/v1"),
        ("http://api.example.com", "http://api.example.com/v1"),  # written out: kept, with a warning
    ],
)
def test_the_scheme_follows_where_the_host_is(typed: str, expected: str) -> None:
    assert normalize_base_url(typed) == expected


def test_http_to_a_public_host_warns_and_private_hosts_do_not() -> None:
    assert "clear text" in cleartext_warning("http://api.example.com/v1")
    assert "clear text" in cleartext_warning("http://8.8.8.8:8000/v1")
    for quiet in ("https://api.example.com/v1", "http://localhost:11434/v1", "http://192.168.1.2/v1", "gpu-box:1"):
        assert cleartext_warning(quiet) is None


def test_a_client_with_a_key_over_public_http_logs_the_warning_without_the_key(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.remote.client"):
        RemoteClient("http://api.example.com:8000", api_key="sk-secret-value", name="public")
        RemoteClient("http://127.0.0.1:8000", api_key="sk-secret-value", name="local")
        RemoteClient("http://api.example.com:8000", name="no key")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "public" in warnings[0] and "clear text" in warnings[0]
    assert "sk-secret-value" not in caplog.text


def test_the_endpoint_dialog_shows_the_warning(qtbot) -> None:
    from widgets.dialogs.endpoint import EndpointDialog

    dialog = EndpointDialog(lambda _url, _key: [], url_warning=cleartext_warning)
    qtbot.addWidget(dialog)
    dialog.base_url.setText("http://api.example.com:8000")
    assert dialog.url_warning.isVisibleTo(dialog) and "clear text" in dialog.url_warning.text()
    dialog.base_url.setText("localhost:11434")
    assert not dialog.url_warning.isVisibleTo(dialog)
