"""The Experiments menu: an experiment runs in the engine thread, shows in the dashboard, then hands back."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QMenu

from engine.experiments.plumbing import ExperimentSizes
from widgets.dashboard.dashboard import DashboardWidget


@pytest.fixture
def worker(tiny_model_dir):
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine
    from engine.core.engine_thread import EngineThread
    from engine.load.loader import load_model

    engine = Engine(load_model(str(tiny_model_dir)), EngineConfig(kv_pages=64, page_size=4))
    thread = EngineThread(engine).start()
    yield thread
    thread.shutdown()


@pytest.fixture
def controller(qtbot, worker):
    from app.hosting.experiments_controller import ExperimentController

    dashboard = DashboardWidget(worker.engine.metrics.snapshot, cpu_share=1.0)
    dashboard.set_source(worker.engine.metrics.snapshot, "engine")
    qtbot.addWidget(dashboard)
    dashboard.show()
    return ExperimentController(lambda: worker, dashboard, ExperimentSizes.small())


def test_an_experiment_shows_its_phases_and_table_then_hands_back(qtbot, controller, worker) -> None:
    from app.hosting.experiments_controller import build_experiments_menu

    dashboard = controller.dashboard
    menu = QMenu()
    actions = build_experiments_menu(menu, controller)
    assert [a.text() for a in actions][:2] == ["Prefill vs decode", "Batching"]
    with qtbot.waitSignal(controller.result_ready, timeout=60_000) as blocker:
        actions[2].trigger()  # Prefix sharing
        assert not actions[0].isEnabled() and actions[-1].isEnabled()  # running: only Stop
    result = blocker.args[0]
    assert result.name == "prefix_sharing"
    assert dashboard.results.cells() == result.rows and "results" in dashboard.visible_panels()
    labels = [text for _, text in dashboard.history.annotations]
    assert labels == ["experiment: prefix sharing, caching on", "experiment: prefix sharing, caching off", "engine"]
    assert dashboard.source == worker.engine.metrics.snapshot  # the chats' engine again
    assert dashboard.history.steps.size > 0  # the experiment's steps are in the charts
    assert actions[0].isEnabled() and not actions[-1].isEnabled()


def test_stop_ends_the_experiment(qtbot, controller) -> None:
    controller.sizes = ExperimentSizes.small()
    with qtbot.waitSignal(controller.running_changed, timeout=5_000, check_params_cb=lambda on: not on):
        assert controller.run("memory_pressure")
        controller.cancel()
    assert "stopped" in controller.dashboard.results.status.text()


def test_one_at_a_time_and_only_with_a_model(qtbot, controller) -> None:
    failures = []
    controller.experiment_failed.connect(failures.append)
    assert controller.run("batching")
    assert not controller.run("batching")
    qtbot.waitUntil(lambda: not controller.running, timeout=60_000)
    controller._worker = lambda: None
    assert not controller.run("batching")
    assert failures == [
        "an experiment is already running; stop it first",
        "load a model first: experiments run on the loaded model",
    ]


def test_a_new_experiment_clears_the_last_ones_table_from_under_its_heading(qtbot, controller) -> None:
    results = controller.dashboard.results
    with qtbot.waitSignal(controller.result_ready, timeout=60_000):
        assert controller.run("prefill_vs_decode")
    assert len(results.cells()) == 2 and "Prefill vs decode" in results.heading.text()
    with qtbot.waitSignal(controller.running_changed, timeout=60_000, check_params_cb=lambda on: not on):
        assert controller.run("batching")
        assert results.cells() == [] and not results.table.isVisible()  # not prefill's rows under Batching
        assert "Batching" in results.heading.text() and "Prefill" not in results.heading.text()
        assert "chats wait" in results.status.text()
    assert [row[0] for row in results.cells()] == ["1", "3"] and "Batching" in results.heading.text()
