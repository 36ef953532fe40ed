"""An experiment (or a comparison) has the engine to itself: chats wait and say what for, the status bar says so,
and Stop in the chat's notice ends it and lets the reply go on (defect 1 of the window issue)."""

from __future__ import annotations

import threading

import pytest

from engine.experiments import catalog
from engine.experiments.plumbing import ExperimentCancelled
from tests.app.conftest import settings, wait_idle


@pytest.fixture
def endless_experiment(monkeypatch):
    """The Capacity experiment, measuring until it is stopped (a real one takes minutes on a real model)."""
    started = threading.Event()

    def measure(ctx):
        started.set()
        while not ctx.cancelled.wait(0.05):
            pass
        raise ExperimentCancelled()

    patched = [catalog.Experiment(e.key, e.title, e.description, measure if e.key == "capacity" else e.run)
               for e in catalog.EXPERIMENTS]  # fmt: skip
    monkeypatch.setattr(catalog, "EXPERIMENTS", tuple(patched))
    return started


def test_a_chat_sent_during_an_experiment_waits_visibly_and_stop_lets_it_go_on(
    qtbot, make_window, endless_experiment
) -> None:
    window = make_window()
    window.add_dashboard()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=8))
    assert window.experiments.run("capacity")
    assert endless_experiment.wait(30)
    assert chat.send("Hi there")
    view = chat.panel.transcript.views[-1]
    assert "waiting for the Capacity experiment" in view._status.text()  # not "writing…" for minutes
    notice = chat.panel.notice
    assert notice.isVisible() and "Capacity experiment" in notice.text
    assert notice.action_button.text() == "Stop the experiment"
    window.refresh_status()
    assert window.status.requests.text() == "running 0 · waiting 1 for the Capacity experiment"
    notice.action_button.click()
    wait_idle(qtbot, chat)
    reply = chat.messages[-1]
    assert reply.error is None and reply.stats.output_tokens > 0  # sent once the experiment ended
    assert not notice.isVisible() or "Capacity" not in notice.text
    window.refresh_status()
    assert "Capacity" not in window.status.requests.text()


def test_a_new_tab_opened_during_an_experiment_waits_too(qtbot, make_window, endless_experiment) -> None:
    window = make_window()
    window.add_dashboard()
    assert window.experiments.run("capacity")
    assert endless_experiment.wait(30)
    chat = window.tabs.new_chat(settings(max_tokens=4))
    assert chat.send("Hello")
    assert "waiting for the Capacity experiment" in chat.panel.transcript.views[-1]._status.text()
    window.experiments.cancel()
    wait_idle(qtbot, chat)
    assert chat.messages[-1].stats.output_tokens > 0
