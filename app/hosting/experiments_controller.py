"""Runs the Experiments menu's experiments in the engine thread and shows them on the dashboard."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu

from engine.core.engine_thread import EngineThread
from engine.errors import StudioError
from engine.experiments.catalog import EXPERIMENTS, experiment
from engine.experiments.plumbing import ExperimentCancelled, ExperimentContext, ExperimentResult, ExperimentSizes
from widgets.dashboard.dashboard import DashboardWidget

log = logging.getLogger(__name__)


class ExperimentController(QObject):
    """One experiment at a time. It runs inside the engine thread, between steps, so nothing else touches the
    model meanwhile and the measurements are clean; chats that are streaming pause until it ends."""

    phase_started = Signal(object, str)  # (metrics snapshot function, label), from the engine thread
    progress_changed = Signal(str)
    result_ready = Signal(object)  # ExperimentResult
    experiment_failed = Signal(str)
    running_changed = Signal(bool)
    _finished = Signal(object)  # the Future, handed from the engine thread to this one

    def __init__(
        self,
        worker: Callable[[], EngineThread | None],
        dashboard: DashboardWidget,
        sizes: ExperimentSizes | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._worker = worker
        self.dashboard = dashboard
        self.sizes = sizes or ExperimentSizes()
        self._cancel = threading.Event()
        self._future: Future | None = None
        self._restore: tuple = (None, "")
        self.title = ""  # of the experiment running, or the last one
        self.phase_started.connect(self._show_phase)
        self.progress_changed.connect(self._show_progress)
        self._finished.connect(self._done)

    @property
    def running(self) -> bool:
        return self._future is not None

    def run(self, key: str) -> bool:
        """Start an experiment; False (and a message) when one is running or no model is loaded."""
        worker = self._worker()
        if self.running:
            self.experiment_failed.emit("an experiment is already running; stop it first")
            return False
        if worker is None or not worker.alive:
            self.experiment_failed.emit("load a model first: experiments run on the loaded model")
            return False
        chosen = experiment(key)
        self.title = chosen.title
        self._cancel = threading.Event()
        self._restore = (self.dashboard.source, self.dashboard.source_label.text())
        self.dashboard.set_panel_visible("results", True)
        # the last experiment's table goes at once: its rows under this one's heading would read as this one's
        self.dashboard.results.show_started(chosen.title, running_status("starting"))

        def run_in_engine_thread(engine) -> ExperimentResult:
            ctx = ExperimentContext(
                engine.loaded,
                engine.config,
                self.sizes,
                on_phase=self.phase_started.emit,
                progress=self.progress_changed.emit,
                cancelled=self._cancel,
            )
            return chosen.run(ctx)

        self._future = worker.call(run_in_engine_thread)
        self._future.add_done_callback(self._finished.emit)
        self.running_changed.emit(True)
        return True

    def cancel(self) -> None:
        self._cancel.set()

    def _show_progress(self, text: str) -> None:
        if self.running:  # a late message must not overwrite how the experiment ended
            self.dashboard.results.show_status(running_status(text.removeprefix("experiment: ")))

    def _show_phase(self, source, label: str) -> None:
        self.dashboard.set_source(source, label)

    def _done(self, future: Future) -> None:
        self._future = None
        source, label = self._restore
        self.dashboard.set_source(source, label)
        self.running_changed.emit(False)
        try:
            result: ExperimentResult = future.result()
        except ExperimentCancelled:
            self.dashboard.results.show_status("The experiment was stopped.")
            return
        except StudioError as exc:
            self._fail(str(exc))
            return
        except Exception as exc:  # a bug must not take the window down: say so and log it
            log.exception("experiment failed")
            self._fail(f"{type(exc).__name__}: {exc}")
            return
        self.dashboard.show_experiment_result(result.title, result.columns, result.rows, result.notes)
        self.result_ready.emit(result)

    def _fail(self, message: str) -> None:
        self.dashboard.results.show_status(f"The experiment failed: {message}")
        self.experiment_failed.emit(message)


def running_status(step: str) -> str:
    """The status line while an experiment runs: what it does now, and that chats wait for it."""
    return f"Running: {step} — chats wait until it ends (Experiments › Stop experiment ends it sooner)."


def build_experiments_menu(menu: QMenu, controller: ExperimentController) -> list[QAction]:
    """One action per experiment, and Stop; actions are disabled while an experiment runs."""
    actions = []
    for item in EXPERIMENTS:
        action = menu.addAction(item.title)
        action.setToolTip(item.description)
        action.setStatusTip(item.description)
        action.triggered.connect(lambda _checked=False, key=item.key: controller.run(key))
        actions.append(action)
    menu.addSeparator()
    stop = menu.addAction("Stop experiment")
    stop.setEnabled(False)
    stop.triggered.connect(controller.cancel)

    def running(on: bool) -> None:
        for action in actions:
            action.setEnabled(not on)
        stop.setEnabled(on)

    controller.running_changed.connect(running)
    return [*actions, stop]
