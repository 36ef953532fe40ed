"""Window fixtures: a fresh studio home per test, and a main window on the tiny model."""

from __future__ import annotations

import dataclasses

import pytest


@pytest.fixture
def studio_home(tmp_path, monkeypatch):
    """Chats and settings of this test only (the session fixture already isolates the whole run)."""
    home = tmp_path / "home"
    monkeypatch.setenv("INFERENCE_STUDIO_HOME", str(home))
    return home


@pytest.fixture
def ignore_eos(monkeypatch):
    """The tiny random model may emit end-of-turn at any point; replies here must run to max_tokens."""
    from engine.domain.chat import ChatSettings

    original = ChatSettings.to_params
    monkeypatch.setattr(ChatSettings, "to_params", lambda self: dataclasses.replace(original(self), ignore_eos=True))


@pytest.fixture
def tiny_choice(tiny_model_dir):
    from engine.domain.model_choice import ModelChoice

    return ModelChoice(spec=str(tiny_model_dir), kv_memory_mib=16)


@pytest.fixture
def make_window(qtbot, studio_home, tiny_choice, monkeypatch):
    """build(load=True) -> MainWindow, shown offscreen, with the tiny model loaded unless load=False.
    Confirmation questions answer yes unless a test says otherwise."""
    from app.window.main_window import MainWindow
    from app.window.settings import StudioSettings

    windows = []
    monkeypatch.setattr(MainWindow, "confirm", lambda self, title, question: True)

    def build(load: bool = True):
        window = MainWindow(StudioSettings())
        windows.append(window)
        window.show()
        if load:
            window.load_model(tiny_choice)
            qtbot.waitUntil(lambda: window.bridge.thread is not None, timeout=60_000)
        return window

    yield build
    for window in windows:
        window.close()
        window.deleteLater()


def wait_idle(qtbot, *controllers, timeout: int = 60_000) -> None:
    qtbot.waitUntil(lambda: not any(c.busy for c in controllers), timeout=timeout)


def settings(**changes):
    from engine.domain.chat import ChatSettings

    base = ChatSettings(temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0, max_tokens=24)
    return dataclasses.replace(base, **changes)
