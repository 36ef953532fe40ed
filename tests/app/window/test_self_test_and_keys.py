"""Keyboard shortcuts of the window, and `inference-studio --self-test` as the installers run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from PySide6.QtCore import Qt

from tests.app.conftest import settings, wait_idle


def test_keyboard_shortcuts_open_switch_and_stop(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)  # window shortcuts only reach the active window
    first = window.tabs.current
    qtbot.keyClick(first.panel.input, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)
    assert len(window.tabs.controllers) == 2 and window.tabs.widget.currentIndex() == 1
    qtbot.keyClick(window.tabs.current.panel.input, Qt.Key.Key_Tab, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.current is first
    first.set_settings(settings(max_tokens=1000))
    qtbot.keyClicks(first.panel.input, "hello")
    qtbot.keyClick(first.panel.input, Qt.Key.Key_Return)
    assert first.streaming and first.panel.input.toPlainText() == ""
    qtbot.waitUntil(lambda: bool(first.messages[-1].content), timeout=30_000)
    qtbot.keyClick(first.panel.input, Qt.Key.Key_Escape)
    wait_idle(qtbot, first)
    assert first.messages[-1].finish_reason == "abort"
    qtbot.keyClick(first.panel.input, Qt.Key.Key_W, Qt.KeyboardModifier.ControlModifier)
    assert len(window.tabs.controllers) == 1 and first not in window.tabs.controllers


def _studio(*args: str, home) -> subprocess.CompletedProcess:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "INFERENCE_STUDIO_HOME": str(home), "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=600, env=env, check=False
    )


def test_self_test_fails_with_a_reason_when_the_model_cannot_load(tmp_path) -> None:
    result = _studio("--self-test", "--model", str(tmp_path / "missing"), home=tmp_path / "home")
    assert result.returncode == 1
    assert "self-test failed: the model did not load: no model at" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_self_test_streams_two_chats_on_the_embedded_model(tmp_path, embedded_model) -> None:  # converted once
    shots = tmp_path / "shots"
    result = _studio("--self-test", "--screenshot", str(shots), home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    assert "self-test passed: two chats streamed at the same time" in result.stdout
    seconds = re.search(r"the first token shown ([0-9.]+) s after start", result.stdout)
    if os.path.exists("/proc/self/stat"):  # the process's start time comes from /proc
        assert seconds is not None and 0 < float(seconds.group(1)) < 300
    names = {p.name for p in shots.glob("*.png")}
    assert {"studio-streaming.png", "studio-light.png", "studio-dark.png"} <= names
    # the live dashboard while both stream; the mid-stream shot needs a machine fast enough to catch both replies
    # a few tokens in before either ends, so it is optional here as in the package smoke test
    assert "dashboard-streaming.png" in names
    assert all((shots / name).stat().st_size > 10_000 for name in names)
    # the window as a laptop shows it with the dashboard docked, and a compare of two targets after both replied
    assert {"studio-docked.png", "compare.png"} <= names
    header = (shots / "studio-docked.png").read_bytes()[16:24]
    assert (int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")) == (1280, 800)
    assert "compared two targets by token" in result.stdout
